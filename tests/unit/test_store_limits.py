"""The store limits of issue 18 item 5 and the Cassandra delete timestamps of item 6,
without a server.

The contract suite (``tests/contract/test_store_contract.py``) shows the limits on
every backend, Cassandra included; here: that the bound clamping the Cassandra backend
relies on selects exactly what the original bounds select (a property, checked with a
small key limit where every case can be reached), that the Cassandra backend sends
nothing for a refused call and only clamped bounds and 32-bit limits for an accepted
one, that no write batch outgrows its largest write, and the timestamp a delete
carries.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_adapters import (
    MAX_CELL_KEY_BYTES,
    MAX_PAGE_SIZE,
    MAX_ROW_BYTES,
    MAX_SYSTEM_KEY_BYTES,
    MAX_SYSTEM_VALUE_BYTES,
    MAX_VALUE_BYTES,
    VersionWrite,
)
from storage_adapters._base import clamp_scan_bounds

pytestmark = pytest.mark.unit

# --- clamping scan bounds: the same selection, whatever the bounds ----------------------

_SMALL_LIMIT = 6  # row + column of a stored cell, scaled down from MAX_CELL_KEY_BYTES
_ALPHABET = st.sampled_from([0, 1, 2])
_KEY_BYTES = st.integers(0, _SMALL_LIMIT + 3).flatmap(
    lambda n: st.lists(_ALPHABET, min_size=n, max_size=n).map(bytes)
)


@st.composite
def _scans(draw: st.DrawFn) -> tuple[list[tuple[bytes, bytes]], bytes, bytes, bytes | None]:
    """Bounds, and stored cells near them: prefixes of a bound, some with the last byte
    changed, cut to what a store holds (the cases where clamping could go wrong)."""
    start_row, start_column = draw(_KEY_BYTES), draw(_KEY_BYTES)
    end_row = draw(st.none() | _KEY_BYTES)
    rows = [start_row, end_row or b"", draw(_KEY_BYTES)]

    def near(source: bytes) -> bytes:
        whole, random_length = len(source), draw(st.integers(0, len(source)))
        key = source[: draw(st.sampled_from([whole, max(whole - 1, 0), random_length]))]
        if key and draw(st.booleans()):
            key = key[:-1] + bytes([draw(_ALPHABET)])
        return key

    cells = []
    for _ in range(draw(st.integers(0, 8))):
        row = near(draw(st.sampled_from(rows)))[: _SMALL_LIMIT - 1] or b"\x01"
        column = near(draw(st.sampled_from([start_column, draw(_KEY_BYTES)])))
        cells.append((row, column[: _SMALL_LIMIT - len(row)] or b"\x01"))
    return cells, start_row, start_column, end_row


def _selected(
    cell: tuple[bytes, bytes], start_row: bytes, start_column: bytes, end_row: bytes | None
) -> bool:
    return cell >= (start_row, start_column) and (end_row is None or cell[0] < end_row)


@settings(max_examples=500, deadline=None)
@given(case=_scans())
def test_clamped_bounds_select_exactly_the_same_cells(
    case: tuple[list[tuple[bytes, bytes]], bytes, bytes, bytes | None],
) -> None:
    """Over a three-letter alphabet with cells drawn near the bounds: every storable
    cell is selected by the clamped bounds exactly when it is selected by the original
    ones, and the clamped bounds are no longer than a stored key, plus one byte."""
    cells, start_row, start_column, end_row = case
    clamped = clamp_scan_bounds(start_row, start_column, end_row, max_cell_key=_SMALL_LIMIT)
    for cell in cells:
        assert len(cell[0]) + len(cell[1]) <= _SMALL_LIMIT
        assert _selected(cell, start_row, start_column, end_row) == _selected(cell, *clamped)
    new_start_row, new_start_column, new_end_row = clamped
    assert len(new_start_row) + len(new_start_column) <= _SMALL_LIMIT + 1
    assert new_end_row is None or len(new_end_row) <= _SMALL_LIMIT


def test_bounds_no_longer_than_a_stored_key_are_sent_as_they_are() -> None:
    row, column = b"r" * MAX_ROW_BYTES, b"c"
    assert clamp_scan_bounds(row, column, row + b"\x00") == (row, column, row + b"\x00")
    assert clamp_scan_bounds(b"", b"", None) == (b"", b"", None)


# --- the Cassandra backend, over a session that records what would be sent ------------

cassandra_driver = pytest.importorskip(
    "cassandra", reason="needs cassandra-driver (pip install 'percolake[cassandra]')"
)

from cassandra.query import SimpleStatement  # noqa: E402

from storage_adapters._cassandra_reads import SCAN_PAGE_CELLS  # noqa: E402
from storage_adapters._cassandra_session import cell_key  # noqa: E402
from storage_adapters.cassandra import _BATCH_BYTES, CassandraStore, batched  # noqa: E402


class _RecordingSession:
    """Prepares anything; records every request; answers each ``execute`` with
    ``answers`` in turn (empty results once they run out)."""

    def __init__(self, answers: list[list[tuple[Any, ...]]] | None = None, now: int = 0) -> None:
        self.requests: list[tuple[str, Any]] = []
        self.answers = list(answers or [])
        self.cluster = argparse.Namespace(timestamp_generator=lambda: now)

    def prepare(self, query: str) -> Any:
        return argparse.Namespace(query=query, is_idempotent=True)

    def execute(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        self.requests.append((statement.query, params))
        return self.answers.pop(0) if self.answers else []

    def execute_async(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        self.requests.append((statement.query, params))
        return argparse.Namespace(result=lambda: [])


def _store(session: _RecordingSession) -> CassandraStore:
    return CassandraStore._with_session("cassandra://127.0.0.1/fake", session)


_OVER = [
    lambda s: s.put_versions("t", [VersionWrite(b"r" * MAX_ROW_BYTES, b"cc", 1, b"v")]),
    lambda s: s.put_versions("t", [VersionWrite(b"r", b"c", 1, bytes(MAX_VALUE_BYTES + 1))]),
    lambda s: s.get_latest("t", [(b"r" * 65_535, b"c" * 65_535)], 1),
    lambda s: s.get_version_timestamps("t", [(b"r", b"c" * MAX_CELL_KEY_BYTES)]),
    lambda s: s.delete_versions("t", [(b"r", b"c" * MAX_CELL_KEY_BYTES, 1)]),
    lambda s: s.put_unless_exists("_t", b"k" * (MAX_SYSTEM_KEY_BYTES - 1), b"v"),
    lambda s: s.get_system("_t", [b"k" * (MAX_SYSTEM_KEY_BYTES - 1)]),
    lambda s: s.compare_and_set("_t", b"k", bytes(MAX_SYSTEM_VALUE_BYTES + 1), b"v"),
    lambda s: s.compare_and_set("_t", b"k", b"v", bytes(MAX_SYSTEM_VALUE_BYTES + 1)),
]


@pytest.mark.parametrize("call", _OVER)
def test_the_cassandra_backend_sends_nothing_for_a_refused_call(call: Any) -> None:
    session = _RecordingSession()
    with pytest.raises(ValueError, match=r"\d+ bytes"):
        call(_store(session))
    assert session.requests == []


def test_a_cassandra_scan_sends_clamped_bounds_and_32_bit_limits() -> None:
    """Failed before: the backend refused the 17 MiB end bound with ``ValueError`` (and
    sending it would break Cassandra's 16 MiB request limit); a one-row scan sent
    ``LIMIT 2**40``, which the driver cannot encode (``TypeError``)."""
    session = _RecordingSession()
    store = _store(session)
    huge = b"z" * (17 * 1024 * 1024)
    assert list(store.scan("t", b"a", huge, 5, start_column=huge, page_size=2**40)) == []
    assert list(store.scan("t", huge[:-1], huge, 5)) == []  # empty once clamped: no request
    assert list(store.scan("t", b"a", b"a\x00", 5, page_size=2**40)) == []
    assert len(session.requests) == store.shards + 1
    for _, params in session.requests:
        assert all(len(p) <= MAX_CELL_KEY_BYTES + 1 for p in params if isinstance(p, bytes))
        assert params[-1] <= MAX_PAGE_SIZE
    # The one shard asks for a full index page (resolved SCAN_PAGE_CELLS at a time).
    assert session.requests[-1][1][-1] == SCAN_PAGE_CELLS


def test_no_write_batch_is_bigger_than_its_largest_write() -> None:
    """Writes share a batch only while they add up to ``_BATCH_BYTES``: values each
    under ``MAX_VALUE_BYTES`` can never make a request over Cassandra's 16 MiB."""
    statement = SimpleStatement("INSERT %s")
    sizes = [10, MAX_VALUE_BYTES, 4000, 100, 5000, 3000, MAX_VALUE_BYTES, 1, 1, 2000, 2100]
    requests = batched(statement, [(0, (i,), size) for i, size in enumerate(sizes)])
    sent: list[int] = []
    for request, params in requests:
        if params is not None:  # a write on its own
            members = [params[0]]
        else:  # a batch: its statements carry their parameters inline ("INSERT 3")
            members = [int(q.split()[1]) for _, q, _ in request._statements_and_parameters]
        sent += members
        if len(members) > 1:
            assert sum(sizes[m] for m in members) <= _BATCH_BYTES
    assert sorted(sent) == list(range(len(sizes)))
    assert len(requests) < len(sizes)  # small writes did share batches


@pytest.mark.parametrize(
    ("write_time", "now", "expected"),
    [
        (None, 1_000, 1_000),  # nothing found: this client's clock
        (400, 1_000, 1_000),  # written earlier by this clock: the clock
        (5_000, 1_000, 5_001),  # written by a client whose clock is ahead: above it
        ((1 << 63) - 1, 1_000, (1 << 63) - 1),  # a tie at the top: the delete wins ties
    ],
)
def test_a_cassandra_delete_is_stamped_above_the_versions_write_time(
    write_time: int | None, now: int, expected: int
) -> None:
    """Failed before (item 6): the delete carried only the deleting client's clock, so
    a writer whose clock ran ahead kept its version."""
    key = cell_key(b"r", b"c")
    session = _RecordingSession(answers=[[(key, write_time)]], now=now)
    _store(session).delete_versions("t", [(b"r", b"c", 7)])
    (read, read_params), (delete, delete_params) = session.requests
    assert "WRITETIME(deleted)" in read and read_params == ("t", [key], 7)
    assert "USING TIMESTAMP ?" in delete and delete_params == (expected, "t", key, 7)
