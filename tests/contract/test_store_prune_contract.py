"""Sweeping below a safe point, on every backend (issue 27): range deletes of versions
(``KVStore.delete_version_ranges``) and the prune of cells with no version left
(``KVStore.prune_cells``). Memory and SQLite find cells through their versions, so their
prune has nothing to do; Cassandra drops the ``cells`` index rows of dead cells, and a
version written at or above the prune's bound must never be hidden, whenever it lands:
before the prune reads its cell, between that read and the delete (the race, driven
step by step through the store's two halves), or after.
"""

from __future__ import annotations

import pytest

from storage_adapters import (
    MAX_TIMESTAMP,
    Cell,
    KVStore,
    ScanEntry,
    Version,
    VersionStamp,
    VersionWrite,
)

pytestmark = pytest.mark.contract

CELL = Cell(b"r", b"c")


def _scan(store: KVStore, table: str = "t") -> list[ScanEntry]:
    return list(store.scan(table, b"", None, MAX_TIMESTAMP, page_size=3))


def test_a_range_delete_removes_exactly_the_versions_in_each_range(store: KVStore) -> None:
    store.put_versions(
        "t", [VersionWrite(b"r", b"c", ts, b"v%d" % ts) for ts in range(10, 101, 10)]
    )
    store.put_versions("t", [VersionWrite(b"r", b"d", ts, b"w") for ts in (20, 30)])
    store.stamp_versions("t", [VersionStamp(b"r", b"c", 30, 31), VersionStamp(b"r", b"c", 50, 51)])
    deleted = store.delete_version_ranges(
        "t", [(b"r", b"c", 20, 40), (b"r", b"c", 60, 60), (b"r", b"c", 91, 99), (b"x", b"c", 0, 9)]
    )
    assert deleted == 4
    assert store.get_versions("t", [CELL, (b"r", b"d")]) == {
        CELL: [
            Version(100, b"v100"),
            Version(90, b"v90"),
            Version(80, b"v80"),
            Version(70, b"v70"),
            Version(50, b"v50", 51),
            Version(10, b"v10"),
        ],
        Cell(b"r", b"d"): [Version(30, b"w"), Version(20, b"w")],
    }
    # Idempotent, and the stamps went with their versions.
    assert store.delete_version_ranges("t", [(b"r", b"c", 20, 40)]) == 0
    store.stamp_versions("t", [VersionStamp(b"r", b"c", 30, 31)])
    assert 30 not in {v.ts for v in store.get_versions("t", [CELL])[CELL]}
    # The whole range, both ends of the timestamp range included.
    store.put_versions("t", [VersionWrite(b"e", b"c", ts, b"") for ts in (0, MAX_TIMESTAMP)])
    assert store.delete_version_ranges("t", [(b"e", b"c", 0, MAX_TIMESTAMP)]) == 2
    assert store.get_versions("t", [(b"e", b"c")]) == {}
    assert store.delete_version_ranges("t", []) == 0


@pytest.mark.parametrize(
    ("ranges", "error", "match"),
    [
        ([(b"r", b"c", 5, 4)], ValueError, "low_ts 5 is above high_ts 4"),
        ([(b"r", b"c", -1, 4)], ValueError, "low_ts must be in"),
        ([(b"r", b"c", 1, MAX_TIMESTAMP + 1)], ValueError, "high_ts must be in"),
        ([(b"r", b"c", 1)], TypeError, "must be \\(row, column, low_ts, high_ts\\)"),
        ([(b"", b"c", 1, 2)], ValueError, "row must not be empty"),
    ],
)
def test_a_bad_range_is_refused_before_any_delete(
    store: KVStore, ranges: list[tuple[bytes, bytes, int, int]], error: type, match: str
) -> None:
    store.put_versions("t", [VersionWrite(b"r", b"c", 3, b"v")])
    with pytest.raises(error, match=match):
        store.delete_version_ranges("t", [(b"r", b"c", 0, 9), *ranges])
    assert store.get_versions("t", [CELL]) == {CELL: [Version(3, b"v")]}


def _dead_and_live(store: KVStore) -> None:
    """Live cells among runs of dead ones (every version deleted), in several shards,
    and a cell whose only version lies at or above the prune's bound (100)."""
    store.put_versions(
        "t",
        [VersionWrite(b"d%03d" % i, b"c", 10 + i, b"x") for i in range(60)]
        + [VersionWrite(b"d%03d" % i, b"k", 5, b"live") for i in (7, 30, 31, 59)]
        + [VersionWrite(b"late", b"c", 100, b"above")],
    )
    store.delete_versions("t", [(b"d%03d" % i, b"c", 10 + i) for i in range(60)])


def test_a_prune_changes_no_read(store: KVStore) -> None:
    _dead_and_live(store)
    before = _scan(store)
    assert [e.row for e in before] == [b"d007", b"d030", b"d031", b"d059", b"late"]
    below = [e.row for e in store.scan("t", b"", None, 100)]
    assert below == [b"d007", b"d030", b"d031", b"d059"]
    pruned = store.prune_cells("t", 100)
    assert pruned in (0, 60)  # memory and SQLite: nothing to prune; Cassandra: the dead
    assert _scan(store) == before
    assert [e.row for e in store.scan("t", b"", None, 100)] == below
    assert store.prune_cells("t", 100) == 0  # idempotent: nothing dead is left
    cells = [(b"d%03d" % i, b"k") for i in (7, 30)] + [(b"late", b"c")]
    assert set(store.get_latest("t", cells, MAX_TIMESTAMP)) == {Cell(*c) for c in cells}


def test_a_version_at_or_above_the_bound_written_after_a_prune_is_scanned(
    store: KVStore,
) -> None:
    _dead_and_live(store)
    store.prune_cells("t", 100)
    store.put_versions(
        "t", [VersionWrite(b"d003", b"c", 100, b"again"), VersionWrite(b"d004", b"n", 200, b"")]
    )
    rows = [(e.row, e.column, e.ts) for e in _scan(store)]
    assert (b"d003", b"c", 100) in rows and (b"d004", b"n", 200) in rows
    assert len(rows) == 7


def test_a_writer_racing_the_prune_is_never_hidden(store: KVStore) -> None:
    """Writes at or above the bound land between the prune's reads and its deletes: to
    dead cells inside a run and to a new cell between two of them. Each is scanned."""
    _dead_and_live(store)
    racing = [
        VersionWrite(b"d010", b"c", 100, b"revived"),  # a dead cell inside a run
        VersionWrite(b"d020", b"b", 150, b"new"),  # a new cell inside a run's range
        VersionWrite(b"d040", b"c", MAX_TIMESTAMP, b"top"),
    ]
    _prune_with_writes_between(store, "t", 100, racing)
    scanned = {(e.row, e.column): e.ts for e in store.scan("t", b"", None, MAX_TIMESTAMP)}
    assert scanned[(b"d010", b"c")] == 100
    assert scanned[(b"d020", b"b")] == 150
    assert (b"d040", b"c") not in scanned  # at MAX_TIMESTAMP: no read below a timestamp
    assert store.get_latest(
        "t", [(b"d040", b"c")], MAX_TIMESTAMP
    ) == {} and store.get_version_timestamps(
        "t", [(b"d040", b"c")], below_ts=MAX_TIMESTAMP + 1
    ) == {Cell(b"d040", b"c"): [MAX_TIMESTAMP]}
    # The cell at MAX_TIMESTAMP stays in the index: a later version below it is scanned.
    store.put_versions("t", [VersionWrite(b"d040", b"c", 300, b"v")])
    assert (b"d040", b"c", 300) in [(e.row, e.column, e.ts) for e in _scan(store)]
    scanned_now = _scan(store)
    store.prune_cells("t", 100)  # a second prune takes nothing written above the bound
    assert _scan(store) == scanned_now


def _prune_with_writes_between(
    store: KVStore, table: str, below_ts: int, writes: list[VersionWrite]
) -> None:
    """Prune, with ``writes`` put after the prune read its cells and before it deletes:
    through the Cassandra store's two halves (``_dead_runs``, ``_prune_runs``); the
    other backends have no index, so the writes go first."""
    from storage_adapters.cassandra import CassandraStore

    if not isinstance(store, CassandraStore):
        store.put_versions(table, writes)
        store.prune_cells(table, below_ts)
        return
    runs = [run for shard in range(store.shards) for run in store._dead_runs(table, shard)]
    assert runs, "the race needs dead cells"
    store.put_versions(table, writes)
    store._prune_runs(table, runs, below_ts)
