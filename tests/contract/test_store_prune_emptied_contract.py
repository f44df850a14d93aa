"""The prune of named cells (``KVStore.prune_emptied_cells``, issue 27), on every
backend and both Paxos variants: what a garbage-collection pass runs between full
prunes, over the cells it just emptied. It changes no read, never forgets a cell with a
version (named or not, below the bound or above it), forgets the dead cells between
the named ones of a shard, reads only about its budget of index rows, and a writer
racing it (driven between its reads and its deletes) is never hidden."""

from __future__ import annotations

import pytest

from storage_adapters import MAX_TIMESTAMP, Cell, KVStore, ScanEntry, VersionWrite

pytestmark = pytest.mark.contract


def _scan(store: KVStore, table: str = "t") -> list[ScanEntry]:
    return list(store.scan(table, b"", None, MAX_TIMESTAMP, page_size=3))


def _dead_and_live(store: KVStore) -> None:
    """60 dead cells (every version deleted), live cells among them (one written below
    the bound, 5, in each of their rows), and one whose only version is at the bound."""
    store.put_versions(
        "t",
        [VersionWrite(b"d%03d" % i, b"c", 10 + i, b"x") for i in range(60)]
        + [VersionWrite(b"d%03d" % i, b"k", 5, b"live") for i in (7, 30, 31, 59)]
        + [VersionWrite(b"late", b"c", 100, b"above")],
    )
    store.delete_versions("t", [(b"d%03d" % i, b"c", 10 + i) for i in range(60)])


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
