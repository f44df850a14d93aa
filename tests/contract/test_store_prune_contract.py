"""Sweeping below a safe point, on every backend (issue 27): range deletes of versions
(``KVStore.delete_version_ranges``) and the prune of cells with no version left
(``KVStore.prune_cells``; ``KVStore.prune_emptied_cells`` over named cells). Memory and
SQLite find cells through their versions, so their prune has nothing to do; Cassandra
drops the ``cells`` index rows of dead cells, and a version written at or above the
prune's bound must never be hidden, whenever it lands: before the prune reads its
cell, between that read and the delete (the race, driven step by step through the
store's two halves), or after.
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


# --- the prune of named cells (KVStore.prune_emptied_cells) -----------------------
# What a garbage-collection pass runs between full prunes, over the cells it just
# emptied: it changes no read, never forgets a cell with a version (named or not, below
# the bound or above it), forgets the dead cells between the named ones of a shard,
# reads only about its budget of index rows, and a writer racing it (driven between its
# reads and its deletes) is never hidden.


def _cassandra(store: KVStore) -> bool:
    from storage_adapters.cassandra import CassandraStore

    return isinstance(store, CassandraStore)


def test_a_prune_of_named_cells_changes_no_read_and_spares_live_cells(store: KVStore) -> None:
    _dead_and_live(store)
    before = _scan(store)
    named = [Cell(b"d%03d" % i, b"c") for i in range(30)]
    # Live cells named too (a caller's mistake must cost nothing): kept.
    named += [Cell(b"d007", b"k"), Cell(b"late", b"c")]
    pruned = store.prune_emptied_cells("t", 100, named)
    assert pruned == (30 if _cassandra(store) else 0)
    assert _scan(store) == before
    assert store.prune_emptied_cells("t", 100, named) == 0  # idempotent
    # The dead cells not named, beyond every named one of their shard, are left to
    # the full prune.
    assert store.prune_cells("t", 100) == (30 if _cassandra(store) else 0)
    assert _scan(store) == before
    assert store.prune_emptied_cells("t", 100, []) == 0
    assert store.prune_emptied_cells("t", 0, named) == 0
    with pytest.raises(TypeError, match="cells must be an iterable"):
        store.prune_emptied_cells("t", 100, b"d001")  # type: ignore[arg-type]
    assert _scan(store) == before


def test_a_writer_racing_a_prune_of_named_cells_is_never_hidden(store: KVStore) -> None:
    _dead_and_live(store)
    named = [Cell(b"d%03d" % i, b"c") for i in range(60)]
    racing = [
        VersionWrite(b"d010", b"c", 100, b"revived"),  # a named dead cell
        VersionWrite(b"d020", b"b", 150, b"new"),  # a new cell inside a run's range
    ]
    if _cassandra(store):
        from storage_adapters._cassandra_url import shard_of
        from storage_adapters.cassandra import CassandraStore

        assert isinstance(store, CassandraStore)
        by_shard: dict[int, list[tuple[bytes, bytes]]] = {}
        for cell in named:
            by_shard.setdefault(shard_of(cell.row, store.shards), []).append(cell)
        runs = [
            run
            for shard, cells in by_shard.items()
            for run in store._dead_runs("t", shard, min(cells), max(cells), 1000)
        ]
        assert sum(run.cells for run in runs) == 60
        store.put_versions("t", racing)
        store._prune_runs("t", runs, 100)
    else:
        store.put_versions("t", racing)
        store.prune_emptied_cells("t", 100, named)
    scanned = {(e.row, e.column): e.ts for e in _scan(store)}
    assert scanned[(b"d010", b"c")] == 100
    assert scanned[(b"d020", b"b")] == 150
    assert [row for row, col in scanned if col == b"k"] == [b"d007", b"d030", b"d031", b"d059"]


def test_a_prune_of_named_cells_reads_about_its_budget_only(store: KVStore) -> None:
    """Two named dead cells of one shard with 2,000 dead ones between them: the prune
    stops after about its budget (4 index rows a named cell, and a page) and the full
    prune takes the rest."""
    from storage_adapters._cassandra_url import shard_of

    shards = getattr(store, "shards", 1)
    rows = [b"s%05d" % i for i in range(200_000) if shard_of(b"s%05d" % i, shards) == 0]
    rows = rows[:2_002]
    store.put_versions("t", [VersionWrite(row, b"c", 10, b"x") for row in rows])
    store.delete_versions("t", [(row, b"c", 10) for row in rows])
    store.put_versions("t", [VersionWrite(b"zzz", b"c", 10, b"live")])
    named = [Cell(rows[0], b"c"), Cell(rows[-1], b"c")]
    pruned = store.prune_emptied_cells("t", 100, named)
    if _cassandra(store):
        assert 1_000 <= pruned <= 1_010
        assert store.prune_cells("t", 100) == 2_002 - pruned
    else:
        assert pruned == 0
    assert [e.row for e in _scan(store)] == [b"zzz"]
