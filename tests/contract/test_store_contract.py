"""Behaviour every ``KVStore`` backend shares, run against each backend in ``conftest.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from storage_adapters import (
    MAX_CELL_KEY_BYTES,
    MAX_ROW_BYTES,
    MAX_SYSTEM_KEY_BYTES,
    MAX_SYSTEM_VALUE_BYTES,
    MAX_TIMESTAMP,
    MAX_VALUE_BYTES,
    Cell,
    KVStore,
    ScanEntry,
    StoreClaimedError,
    Version,
    VersionStamp,
    VersionWrite,
    open_store,
)
from storage_adapters.memory import MemoryStore

pytestmark = pytest.mark.contract


def _w(row: bytes, col: bytes, ts: int, value: bytes | None) -> VersionWrite:
    return VersionWrite(row, col, ts, value)


def test_get_latest_returns_newest_version_below_timestamp(store: KVStore) -> None:
    store.put_versions("t", [_w(b"r", b"c", 10, b"a"), _w(b"r", b"c", 20, b"b")])
    assert store.get_latest("t", [(b"r", b"c")], 11) == {Cell(b"r", b"c"): Version(10, b"a")}
    assert store.get_latest("t", [(b"r", b"c")], 20) == {Cell(b"r", b"c"): Version(10, b"a")}
    assert store.get_latest("t", [(b"r", b"c")], 21) == {Cell(b"r", b"c"): Version(20, b"b")}
    assert store.get_latest("t", [(b"r", b"c")], 10) == {}


def test_get_latest_is_batched_and_leaves_out_absent_cells(store: KVStore) -> None:
    store.put_versions("t", [_w(b"a", b"x", 1, b"1"), _w(b"b", b"x", 2, b"2")])
    got = store.get_latest("t", [(b"a", b"x"), (b"b", b"x"), (b"c", b"x")], MAX_TIMESTAMP)
    assert got == {Cell(b"a", b"x"): Version(1, b"1"), Cell(b"b", b"x"): Version(2, b"2")}


def test_tombstones_and_empty_values_are_distinct(store: KVStore) -> None:
    store.put_versions("t", [_w(b"r", b"c", 1, b""), _w(b"r", b"d", 1, None)])
    got = store.get_latest("t", [(b"r", b"c"), (b"r", b"d")], 5)
    assert got[Cell(b"r", b"c")] == Version(1, b"")
    assert got[Cell(b"r", b"d")] == Version(1, None)


def test_tables_are_independent(store: KVStore) -> None:
    store.put_versions("one", [_w(b"r", b"c", 1, b"1")])
    assert store.get_latest("two", [(b"r", b"c")], 5) == {}
    assert list(store.scan("two", b"", None, 5)) == []


def test_rewriting_a_version_is_idempotent(store: KVStore) -> None:
    store.put_versions("t", [_w(b"r", b"c", 1, b"v")])
    store.put_versions("t", [_w(b"r", b"c", 1, b"v")])
    assert store.get_version_timestamps("t", [(b"r", b"c")]) == {Cell(b"r", b"c"): [1]}


def test_scan_is_ordered_bounded_and_newest_per_cell(store: KVStore) -> None:
    rows = [bytes([i]) for i in range(1, 40)]
    store.put_versions("t", [_w(r, b"c", 5, b"old" + r) for r in reversed(rows)])
    store.put_versions("t", [_w(r, b"c", 9, b"new" + r) for r in rows[::2]])
    store.put_versions("t", [_w(r, b"b", 3, b"b" + r) for r in rows[:5]])
    got = list(store.scan("t", b"\x03", b"\x20", 8, page_size=4))
    expected = []
    for r in rows:
        if b"\x03" <= r < b"\x20":
            if r in rows[:5]:
                expected.append(ScanEntry(r, b"b", 3, b"b" + r))
            expected.append(ScanEntry(r, b"c", 5, b"old" + r))
    assert got == expected
    newest = list(store.scan("t", b"", None, MAX_TIMESTAMP, page_size=7))
    assert [(e.row, e.column) for e in newest] == sorted((e.row, e.column) for e in newest)
    assert all(e.ts == (9 if e.row in rows[::2] and e.column == b"c" else e.ts) for e in newest)


def test_scan_skips_cells_with_no_version_below_timestamp(store: KVStore) -> None:
    store.put_versions("t", [_w(b"a", b"c", 10, b"x"), _w(b"b", b"c", 1, b"y")])
    assert list(store.scan("t", b"", None, 5)) == [ScanEntry(b"b", b"c", 1, b"y")]


def test_scan_resumes_from_start_column(store: KVStore) -> None:
    store.put_versions("t", [_w(b"r", c, 1, c) for c in (b"a", b"b", b"c")])
    store.put_versions("t", [_w(b"s", b"a", 1, b"a")])
    got = [(e.row, e.column) for e in store.scan("t", b"r", None, 5, start_column=b"b")]
    assert got == [(b"r", b"b"), (b"r", b"c"), (b"s", b"a")]


def test_scan_pages_through_many_rows(store: KVStore) -> None:
    rows = [f"row{i:05d}".encode() for i in range(2500)]
    store.put_versions("t", [_w(r, b"c", 1, r) for r in rows])
    got = [e.row for e in store.scan("t", b"", None, 2, page_size=1000)]
    assert got == rows


def test_version_timestamps_newest_first_with_bounds_and_limit(store: KVStore) -> None:
    store.put_versions("t", [_w(b"r", b"c", ts, b"v") for ts in (3, 7, 1, 9, 5)])
    cell = Cell(b"r", b"c")
    assert store.get_version_timestamps("t", [(b"r", b"c")]) == {cell: [9, 7, 5, 3, 1]}
    assert store.get_version_timestamps("t", [(b"r", b"c")], above_ts=3, below_ts=9) == {
        cell: [7, 5]
    }
    assert store.get_version_timestamps("t", [(b"r", b"c")], below_ts=8, limit=2) == {cell: [7, 5]}
    assert store.get_version_timestamps("t", [(b"r", b"c")], above_ts=9) == {}


#: Versions at both ends of the timestamp range, and bounds around them.
EDGE_TSS = (0, 1, MAX_TIMESTAMP - 1, MAX_TIMESTAMP)
EDGE_BOUNDS = (-(2**64), -2, -1, 0, 1, 2, MAX_TIMESTAMP - 1, MAX_TIMESTAMP, 2**63, 2**64)


def test_version_timestamps_at_the_edges_of_the_range(store: KVStore) -> None:
    """Fails on the code before issue 30 item 11: with ``below_ts=2**63`` Cassandra left
    out the version at MAX_TIMESTAMP (it clamped the open bound to MAX_TIMESTAMP, which
    excludes it) and SQLite raised OverflowError; memory returned it. Every pair of
    bounds, beyond the stored range too, selects exactly ``above_ts < ts < below_ts``."""
    cell = Cell(b"r", b"c")
    store.put_versions("t", [_w(b"r", b"c", ts, b"v%d" % i) for i, ts in enumerate(EDGE_TSS)])
    assert store.get_version_timestamps("t", [cell], below_ts=2**63) == {
        cell: [MAX_TIMESTAMP, MAX_TIMESTAMP - 1, 1, 0]
    }
    for above in EDGE_BOUNDS:
        for below in EDGE_BOUNDS:
            expected = sorted((ts for ts in EDGE_TSS if above < ts < below), reverse=True)
            got = store.get_version_timestamps("t", [cell], above_ts=above, below_ts=below)
            assert got == ({cell: expected} if expected else {}), (above, below)
            limited = store.get_version_timestamps(
                "t", [cell], above_ts=above, below_ts=below, limit=1
            )
            assert limited == ({cell: expected[:1]} if expected else {}), (above, below)


def test_reads_below_a_timestamp_at_the_edges_of_the_range(store: KVStore) -> None:
    """The same class of edge for every read that takes ``below_ts`` (valid in
    ``[0, MAX_TIMESTAMP]``): ts 0, 1 and MAX_TIMESTAMP, read below 0, 1, 2 and
    MAX_TIMESTAMP, and stamps, deletes and sweeps of the versions at both ends."""
    cell = Cell(b"r", b"c")
    store.put_versions("t", [_w(b"r", b"c", ts, b"v%d" % ts) for ts in (0, 1, MAX_TIMESTAMP)])
    for below, newest in ((0, None), (1, 0), (2, 1), (MAX_TIMESTAMP, 1)):
        expected = {} if newest is None else {cell: Version(newest, b"v%d" % newest)}
        assert store.get_latest("t", [cell], below) == expected, below
        scanned = list(store.scan("t", b"", None, below))
        assert scanned == [ScanEntry(b"r", b"c", v.ts, v.value) for v in expected.values()]
        older = [ts for ts in (1, 0) if ts < below]
        versions = store.get_versions("t", [cell], below_ts=below)
        assert versions == ({cell: [Version(ts, b"v%d" % ts) for ts in older]} if older else {})
        swept = list(store.sweep_candidates("t", below, 0))
        assert swept == ([cell] if older else []), below
    # A stamp at the top of the range, on the versions at both ends.
    store.stamp_versions(
        "t", [VersionStamp(b"r", b"c", 0, MAX_TIMESTAMP), VersionStamp(b"r", b"c", 1, 2)]
    )
    assert store.get_versions("t", [cell], below_ts=MAX_TIMESTAMP) == {
        cell: [Version(1, b"v1", 2), Version(0, b"v0", MAX_TIMESTAMP)]
    }
    assert store.get_latest("t", [cell], 1) == {cell: Version(0, b"v0", MAX_TIMESTAMP)}
    store.delete_versions("t", [(b"r", b"c", MAX_TIMESTAMP), (b"r", b"c", 1)])
    assert store.get_version_timestamps("t", [cell], below_ts=2**63) == {cell: [0]}
    # A cell whose one version is stamped is left out of a sweep only below its stamp:
    # (r, c) is stamped at MAX_TIMESTAMP, never below a valid stamped_below.
    other = Cell(b"s", b"c")
    store.put_versions("t", [_w(b"s", b"c", MAX_TIMESTAMP - 2, b"s")])
    store.stamp_versions("t", [VersionStamp(b"s", b"c", MAX_TIMESTAMP - 2, MAX_TIMESTAMP - 1)])
    assert list(store.sweep_candidates("t", MAX_TIMESTAMP, MAX_TIMESTAMP)) in (
        [cell],
        [cell, other],
    )
    assert list(store.sweep_candidates("t", MAX_TIMESTAMP, MAX_TIMESTAMP - 1)) == [cell, other]


def test_delete_versions_is_idempotent(store: KVStore) -> None:
    store.put_versions("t", [_w(b"r", b"c", 1, b"a"), _w(b"r", b"c", 2, b"b")])
    store.delete_versions("t", [(b"r", b"c", 2), (b"r", b"c", 99), (b"x", b"y", 1)])
    store.delete_versions("t", [(b"r", b"c", 2)])
    assert store.get_latest("t", [(b"r", b"c")], 10) == {Cell(b"r", b"c"): Version(1, b"a")}


def test_put_unless_exists_first_writer_wins(store: KVStore) -> None:
    first = store.put_unless_exists("_txn", b"k", b"one")
    second = store.put_unless_exists("_txn", b"k", b"two")
    again = store.put_unless_exists("_txn", b"k", b"one")
    assert (first.applied, first.current) == (True, b"one")
    assert (second.applied, second.current) == (False, b"one")
    assert (again.applied, again.current) == (False, b"one")
    assert store.get_system("_txn", [b"k", b"absent"]) == {b"k": b"one"}


def test_put_unless_exists_under_contention_has_exactly_one_winner(store: KVStore) -> None:
    winners: list[bytes] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        if store.put_unless_exists("_txn", b"race", str(i).encode()).applied:
            winners.append(str(i).encode())

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert store.get_system("_txn", [b"race"]) == {b"race": winners[0]}


def test_compare_and_set(store: KVStore) -> None:
    assert store.compare_and_set("_sys", b"k", None, b"1").applied
    lost = store.compare_and_set("_sys", b"k", None, b"2")
    assert (lost.applied, lost.current) == (False, b"1")
    stale = store.compare_and_set("_sys", b"k", b"0", b"2")
    assert (stale.applied, stale.current) == (False, b"1")
    assert store.compare_and_set("_sys", b"k", b"1", b"2").applied
    assert store.get_system("_sys", [b"k"]) == {b"k": b"2"}


def test_system_rows_and_versions_do_not_mix(store: KVStore) -> None:
    store.put_unless_exists("t", b"k", b"sys")
    store.put_versions("t", [_w(b"k", b"c", 1, b"data")])
    assert store.get_system("t", [b"k"]) == {b"k": b"sys"}
    assert list(store.scan("t", b"", None, 5)) == [ScanEntry(b"k", b"c", 1, b"data")]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.put_versions("bad name", []), ValueError),
        (lambda s: s.put_versions("", []), ValueError),
        (lambda s: s.put_versions("x" * 129, []), ValueError),
        (lambda s: s.put_versions(7, []), TypeError),
        (lambda s: s.put_versions("t", [VersionWrite("r", b"c", 1, b"v")]), TypeError),
        (lambda s: s.put_versions("t", [VersionWrite(b"", b"c", 1, b"v")]), ValueError),
        (lambda s: s.put_versions("t", [VersionWrite(b"r", b"c", -1, b"v")]), ValueError),
        (lambda s: s.put_versions("t", [VersionWrite(b"r", b"c", 1, "v")]), TypeError),
        (lambda s: s.get_latest("t", [("r", b"c")], 1), TypeError),
        (lambda s: s.get_latest("t", [b"rc"], 1), TypeError),
        (lambda s: s.get_latest("t", [(b"r", b"c")], -5), ValueError),
        (lambda s: s.scan("t", "a", None, 1), TypeError),
        (lambda s: s.scan("t", b"", None, 1, page_size=0), ValueError),
        (lambda s: s.get_version_timestamps("t", [(b"r", b"c")], limit=0), ValueError),
        (lambda s: s.get_version_timestamps("t", [(b"r", b"c")], below_ts=True), TypeError),
        (lambda s: s.get_version_timestamps("t", [(b"r", b"c")], above_ts="0"), TypeError),
        (lambda s: s.get_version_timestamps("t", [(b"r", b"c")], below_ts=2.0), TypeError),
        (lambda s: s.get_latest("t", [(b"r", b"c")], 2**63), ValueError),
        (lambda s: s.get_versions("t", [(b"r", b"c")], below_ts=2**63), ValueError),
        (lambda s: s.scan("t", b"", None, 2**63), ValueError),
        (lambda s: s.put_unless_exists("t", b"", b"v"), ValueError),
        (lambda s: s.put_unless_exists("t", b"k", None), TypeError),
        (lambda s: s.compare_and_set("t", "k", None, b"v"), TypeError),
        (lambda s: s.get_system("t", ["k"]), TypeError),
        (lambda s: s.claim("Oracle"), ValueError),
        (lambda s: s.claim("../x"), ValueError),
        (lambda s: s.claim(b"oracle"), TypeError),
    ],
)
def test_bad_input_is_refused_before_any_io(store: KVStore, call, error) -> None:  # type: ignore[no-untyped-def]
    store.put_versions("t", [_w(b"r", b"c", 1, b"before")])
    with pytest.raises(error):
        call(store)
    # Nothing was written by the refused call.
    assert store.get_latest("t", [(b"r", b"c")], MAX_TIMESTAMP) == {
        Cell(b"r", b"c"): Version(1, b"before")
    }
    assert store.get_system("t", [b"k"]) == {}


def test_a_claim_is_exclusive_until_released(store_url_factory: Callable[[], str]) -> None:
    store = open_store(store_url_factory())
    claim = store.claim("role-a")
    if not claim.exclusive:  # a backend that cannot tell: the claim guards nothing
        claim.release()
        claim.release()
        assert not claim.held
        store.close()
        return
    # Another handle on the same data (memory:// data lives in one handle only).
    other = store if store.url.startswith("memory") else open_store(store_url_factory())
    for claimer in {id(store): store, id(other): other}.values():
        with pytest.raises(StoreClaimedError) as held:
            claimer.claim("role-a")
        assert held.value.role == "role-a" and held.value.where
    with other.claim("role-b"):  # roles are independent
        pass
    claim.release()
    claim.release()  # idempotent
    again = other.claim("role-a")
    with pytest.raises(StoreClaimedError):
        store.claim("role-a")
    if other is not store:
        other.close()  # closing a store releases its claims
        store.claim("role-a").release()
    else:
        again.release()
    store.close()


# --- limits (issue 18 item 5): the same on every backend, what Cassandra can store ----

# Row + column of exactly MAX_CELL_KEY_BYTES, split three ways: the limit is on the sum.
_LARGEST_CELLS = [
    (b"r" * MAX_ROW_BYTES, b"c"),
    (b"s", b"c" * MAX_ROW_BYTES),
    (b"t" * 30_000, b"d" * (MAX_CELL_KEY_BYTES - 30_000)),
]
_LONG_TABLE = "x" * 128


def test_the_largest_storable_cells_and_system_rows_round_trip(store: KVStore) -> None:
    """Every limit reached exactly: cells of row + column = MAX_CELL_KEY_BYTES (one with
    a value of MAX_VALUE_BYTES, one a tombstone), system rows of table + key =
    MAX_SYSTEM_KEY_BYTES, and a compare-and-set carrying two values of
    MAX_SYSTEM_VALUE_BYTES. On Cassandra this is the proof that the limits are right:
    each request is as big as the checks let through."""
    values: list[bytes | None] = [bytes(range(256)) * (MAX_VALUE_BYTES // 256), None, b"v"]
    writes = [_w(r, c, 7, v) for (r, c), v in zip(_LARGEST_CELLS, values, strict=True)]
    assert len(writes[0].value or b"") == MAX_VALUE_BYTES
    store.put_versions("t", writes)
    assert store.get_latest("t", _LARGEST_CELLS, 8) == {
        Cell(w.row, w.column): Version(7, w.value) for w in writes
    }
    assert list(store.scan("t", b"", None, 8, page_size=2)) == sorted(
        ScanEntry(w.row, w.column, 7, w.value) for w in writes
    )
    assert store.get_version_timestamps("t", _LARGEST_CELLS) == {
        Cell(r, c): [7] for r, c in _LARGEST_CELLS
    }
    store.delete_versions("t", [(r, c, 7) for r, c in _LARGEST_CELLS])
    assert store.get_latest("t", _LARGEST_CELLS, 8) == {}

    key = b"k" * (MAX_SYSTEM_KEY_BYTES - len("_sys"))
    old, new = b"o" * MAX_SYSTEM_VALUE_BYTES, b"n" * MAX_SYSTEM_VALUE_BYTES
    assert store.put_unless_exists("_sys", key, old).applied
    assert store.compare_and_set("_sys", key, old, new).applied
    assert store.get_system("_sys", [key]) == {key: new}
    long_key = b"k" * (MAX_SYSTEM_KEY_BYTES - len(_LONG_TABLE))
    assert store.compare_and_set(_LONG_TABLE, long_key, None, b"v").applied
    assert store.get_system(_LONG_TABLE, [long_key]) == {long_key: b"v"}


_OVER = MAX_CELL_KEY_BYTES + 1
_OVER_LIMIT = [
    # (id, call, the size the error must name, the limit it must name)
    (
        "put-longest-row-and-2-byte-column",
        lambda s: s.put_versions("t", [_w(b"r" * MAX_ROW_BYTES, b"cc", 1, b"v")]),
        _OVER,
        MAX_CELL_KEY_BYTES,
    ),
    (
        "put-row-and-column-of-65535-each",  # each under the old per-part limit
        lambda s: s.put_versions("t", [_w(b"r" * 65_535, b"c" * 65_535, 1, b"v")]),
        2 * 65_535,
        MAX_CELL_KEY_BYTES,
    ),
    (
        "put-tombstone",
        lambda s: s.put_versions("t", [_w(b"r", b"c" * MAX_CELL_KEY_BYTES, 1, None)]),
        _OVER,
        MAX_CELL_KEY_BYTES,
    ),
    (
        "put-value",
        lambda s: s.put_versions("t", [_w(b"r", b"c", 2, b"v" * (MAX_VALUE_BYTES + 1))]),
        MAX_VALUE_BYTES + 1,
        MAX_VALUE_BYTES,
    ),
    (
        "get-latest",
        lambda s: s.get_latest("t", [(b"r", b"c"), (b"r" * 40_000, b"c" * 25_528)], 9),
        _OVER,
        MAX_CELL_KEY_BYTES,
    ),
    (
        "version-timestamps",
        lambda s: s.get_version_timestamps("t", [(b"r" * _OVER, b"c")]),
        _OVER + 1,
        MAX_CELL_KEY_BYTES,
    ),
    (
        "delete",
        lambda s: s.delete_versions("t", [(b"r", b"c", 1), (b"r" * MAX_ROW_BYTES, b"cc", 1)]),
        _OVER,
        MAX_CELL_KEY_BYTES,
    ),
    (
        "system-key",
        lambda s: s.put_unless_exists("_sys", b"k" * (MAX_SYSTEM_KEY_BYTES - 3), b"v"),
        MAX_SYSTEM_KEY_BYTES + 1,
        MAX_SYSTEM_KEY_BYTES,
    ),
    (
        "system-key-of-a-long-table",
        lambda s: s.compare_and_set(_LONG_TABLE, b"k" * (MAX_SYSTEM_KEY_BYTES - 127), None, b"v"),
        MAX_SYSTEM_KEY_BYTES + 1,
        MAX_SYSTEM_KEY_BYTES,
    ),
    (
        "system-read-key",
        lambda s: s.get_system("_sys", [b"k", b"k" * (MAX_SYSTEM_KEY_BYTES - 3)]),
        MAX_SYSTEM_KEY_BYTES + 1,
        MAX_SYSTEM_KEY_BYTES,
    ),
    (
        "system-value",
        lambda s: s.put_unless_exists("_sys", b"new", b"v" * (MAX_SYSTEM_VALUE_BYTES + 1)),
        MAX_SYSTEM_VALUE_BYTES + 1,
        MAX_SYSTEM_VALUE_BYTES,
    ),
    (
        "compare-and-set-expected",
        lambda s: s.compare_and_set("_sys", b"k", b"e" * (MAX_SYSTEM_VALUE_BYTES + 1), b"v"),
        MAX_SYSTEM_VALUE_BYTES + 1,
        MAX_SYSTEM_VALUE_BYTES,
    ),
    (
        "compare-and-set-value",
        lambda s: s.compare_and_set("_sys", b"k", b"before", b"v" * (MAX_SYSTEM_VALUE_BYTES + 1)),
        MAX_SYSTEM_VALUE_BYTES + 1,
        MAX_SYSTEM_VALUE_BYTES,
    ),
]


@pytest.mark.parametrize(
    ("call", "size", "limit"),
    [pytest.param(call, size, limit, id=name) for name, call, size, limit in _OVER_LIMIT],
)
def test_one_byte_over_a_limit_is_refused_before_any_io(
    store: KVStore, call: Callable[[KVStore], object], size: int, limit: int
) -> None:
    """One byte over each limit: ``ValueError`` naming the limit and the actual size,
    on every backend, and nothing written. Failed before: memory and SQLite stored
    every one of these (a cell of 65,535 + 65,535 bytes among them) though Cassandra
    cannot, and the Cassandra backend checked only each part against 65,535 bytes, so
    it sent them and the server refused them (a conditional write that big even fails
    after it was sent, an unknown outcome)."""
    store.put_versions("t", [_w(b"r", b"c", 1, b"before")])
    store.put_unless_exists("_sys", b"k", b"before")
    with pytest.raises(ValueError) as refused:
        call(store)
    assert str(limit) in str(refused.value) and str(size) in str(refused.value)
    assert list(store.scan("t", b"", None, MAX_TIMESTAMP)) == [ScanEntry(b"r", b"c", 1, b"before")]
    assert store.get_system("_sys", [b"k", b"new"]) == {b"k": b"before"}


def test_scan_bounds_of_any_length_select_what_the_reference_store_selects(store: KVStore) -> None:
    """Scan bounds are bounds, not stored keys: a 17 MiB ``end_row``, ``start_row`` or
    ``start_column`` works on every backend and selects what the memory store selects,
    around the longest storable rows and columns (prefixes of the bound, one byte
    above it, one below). Failed before on Cassandra: a bound over 65,535 bytes was
    refused with ``ValueError``, and one over 16 MiB cannot be sent to Cassandra at
    all (the backend now sends a prefix one byte longer than any storable key,
    which selects the same cells)."""
    huge = b"m" * (17 * 1024 * 1024)
    longest = MAX_ROW_BYTES
    rows = [
        b"l" + b"m" * (longest - 1),
        b"m",
        b"m" * 1000 + b"\x00",
        b"m" * (longest - 1),
        b"m" * longest,  # the longest row, a prefix of the bound
        b"m" * (longest - 1) + b"n",
        b"n",
    ]
    writes = [_w(r, b"c", 3, r[:8]) for r in rows]
    # Columns of row b"m" around a long start_column of c's: the longest one a prefix of
    # it, the next one above it.
    widest = MAX_CELL_KEY_BYTES - 1
    writes += [
        _w(b"m", c, 3, c[:8])
        for c in (b"b", b"c" * (widest - 1), b"c" * widest, b"c" * (widest - 1) + b"d")
    ]
    writes.append(_w(b"m" * longest, b"d", 3, b"longest"))  # the only other column it can have
    reference = MemoryStore()
    for target in (store, reference):
        target.put_versions("t", writes)
    long_column = b"c" * len(huge)
    cases = [
        (b"", b"", huge),
        (b"", b"", b"m" * (longest + 1)),
        (huge, b"", None),
        (huge, long_column, huge + b"x"),
        (b"m" * (longest + 1), long_column, None),
        (b"m", long_column, None),
        (b"m", long_column, huge),
        (b"m", long_column, b"m\x00"),  # one row: one shard on Cassandra
        (b"m" * longest, long_column, None),
        (b"m" * longest, b"c", huge),
        (b"l", b"", b"m" * 1000 + b"\x00\x00"),
    ]
    for start_row, start_column, end_row in cases:
        got = list(store.scan("t", start_row, end_row, 5, start_column=start_column, page_size=3))
        expected = list(
            reference.scan("t", start_row, end_row, 5, start_column=start_column, page_size=3)
        )
        assert [(e.row[:8], len(e.row), e.column[:8], len(e.column)) for e in got] == [
            (e.row[:8], len(e.row), e.column[:8], len(e.column)) for e in expected
        ], (len(start_row), len(start_column), end_row and len(end_row))
        assert got == expected
    # And what the reference selects is right, so that the comparison means something.
    below_huge = [e.row for e in reference.scan("t", b"", huge, 5)]
    assert b"m" * longest in below_huge and b"m" * (longest - 1) + b"n" not in below_huge
    from_long_column = [
        (e.row, e.column) for e in reference.scan("t", b"m", b"m\x00", 5, start_column=long_column)
    ]
    assert from_long_column == [(b"m", b"c" * (widest - 1) + b"d")]


@pytest.mark.parametrize("page_size", [2**31 - 1, 2**31, 2**40, 2**64])
def test_any_positive_page_size_works(store: KVStore, page_size: int) -> None:
    """``page_size`` and ``limit`` are any positive int. Failed before on Cassandra
    from 2**31 on (``TypeError``: CQL's ``LIMIT`` is a 32-bit int) in the one-row scan,
    which asks its one shard for ``page_size`` cells at once (a scan of all shards asks
    each for less first, and failed from 2**35), and for 2**64 on SQLite
    (``OverflowError``); each backend now reads at most ``MAX_PAGE_SIZE`` cells a
    request."""
    rows = [bytes([i]) for i in range(1, 6)]
    store.put_versions("t", [_w(r, b"c", ts, r) for r in rows for ts in (1, 2)])
    assert [e.row for e in store.scan("t", b"", None, 5, page_size=page_size)] == rows
    one_row = store.scan("t", b"\x02", b"\x02\x00", 5, page_size=page_size)
    assert list(one_row) == [ScanEntry(b"\x02", b"c", 2, b"\x02")]
    assert store.get_version_timestamps("t", [(r, b"c") for r in rows], limit=page_size) == {
        Cell(r, b"c"): [2, 1] for r in rows
    }


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.scan("t", b"", None, 1, page_size=True), TypeError),
        (lambda s: s.scan("t", b"", None, 1, page_size=2.0), TypeError),
        (lambda s: s.scan("t", b"", None, 1, page_size=-1), ValueError),
        (lambda s: s.get_version_timestamps("t", [(b"r", b"c")], limit=True), TypeError),
        (lambda s: s.get_version_timestamps("t", [(b"r", b"c")], limit=-3), ValueError),
        (lambda s: s.delete_versions("t", [(b"r", b"c")]), TypeError),
    ],
)
def test_bad_counts_are_refused(store: KVStore, call, error) -> None:  # type: ignore[no-untyped-def]
    """A ``bool`` is not a count and a non-int count is a ``TypeError``, as for
    timestamps. Failed before: ``True`` was read as 1, ``2.0`` refused with
    ``ValueError``, and memory and SQLite unpacked a version to delete that is not a
    triple with a ``ValueError``."""
    with pytest.raises(error):
        call(store)


# --- the life of a version (issue 18 item 6) -------------------------------------------
#
# Written (again only with the same value), then perhaps deleted, never written again
# after that: what KVStore promises, and all the transaction layer does.


def _second_handle(store: KVStore, store_url_factory: Callable[[], str]) -> KVStore:
    """Another client of the same store (memory:// data lives in one handle only)."""
    return store if store.url.startswith("memory") else open_store(store_url_factory())


def _set_client_clock(store: KVStore, micros: int) -> None:
    """Make a Cassandra handle stamp every write with ``micros``: a client whose clock
    is off. Other backends have no client clocks."""
    cluster = getattr(store, "_cluster", None)
    if cluster is not None:
        cluster.timestamp_generator = lambda: micros


def test_rewriting_a_version_with_its_value_changes_nothing(
    store: KVStore, store_url_factory: Callable[[], str]
) -> None:
    """A write whose outcome is unknown may be re-issued, by the same client or
    another: a version rewritten with its value (a tombstone included) is unchanged."""
    other = _second_handle(store, store_url_factory)
    try:
        writes = [_w(b"r", b"c", 4, b"v"), _w(b"r", b"d", 4, None)]
        store.put_versions("t", writes)
        other.put_versions("t", writes[::-1])
        store.put_versions("t", writes)
        for reader in (store, other):
            assert reader.get_latest("t", [(b"r", b"c"), (b"r", b"d")], 5) == {
                Cell(b"r", b"c"): Version(4, b"v"),
                Cell(b"r", b"d"): Version(4, None),
            }
            assert reader.get_version_timestamps("t", [(b"r", b"c"), (b"r", b"d")]) == {
                Cell(b"r", b"c"): [4],
                Cell(b"r", b"d"): [4],
            }
    finally:
        if other is not store:
            other.close()


def test_a_delete_removes_a_version_whatever_the_writers_clock(
    store: KVStore, store_url_factory: Callable[[], str]
) -> None:
    """A version deleted stays deleted, on every backend, even when its writer's clock
    runs an hour ahead of the deleter's and a copy of the write arrives again after the
    delete (a resent request, a replayed hint). Failed before on Cassandra: the delete
    carried the deleting client's clock, an hour behind the write's, so Cassandra kept
    the write and the delete did nothing."""
    writer = _second_handle(store, store_url_factory)
    try:
        an_hour_ahead = int(time.time() * 1e6) + 3_600_000_000
        _set_client_clock(writer, an_hour_ahead)
        aborted = [_w(b"r", b"c", 5, b"aborted"), _w(b"r", b"d", 5, None)]
        writer.put_versions("t", [*aborted, _w(b"r", b"c", 3, b"committed")])
        store.delete_versions("t", [(b"r", b"c", 5), (b"r", b"d", 5)])
        if getattr(writer, "_cluster", None) is not None:
            writer.put_versions("t", aborted)  # the same write again, same timestamp
        for reader in (store, writer):
            assert reader.get_latest("t", [(b"r", b"c"), (b"r", b"d")], 9) == {
                Cell(b"r", b"c"): Version(3, b"committed")
            }
            assert reader.get_version_timestamps("t", [(b"r", b"c"), (b"r", b"d")]) == {
                Cell(b"r", b"c"): [3]
            }
            assert list(reader.scan("t", b"", None, 9)) == [ScanEntry(b"r", b"c", 3, b"committed")]
    finally:
        if writer is not store:
            writer.close()
