"""Behaviour every ``KVStore`` backend shares, run against each backend in ``conftest.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from storage_adapters import (
    MAX_TIMESTAMP,
    Cell,
    KVStore,
    ScanEntry,
    Version,
    VersionWrite,
    open_store,
)
from storage_adapters._base import StoreClaimedError

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
