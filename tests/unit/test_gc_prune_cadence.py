"""How often a collector prunes dead cells (issue 27): ``KVStore.prune_cells`` reads a
table's whole index on Cassandra, so a collector prunes each table at most every
``prune_every_s``, always at its first pass, with the pass's safe point."""

from __future__ import annotations

from storage_adapters import VersionWrite
from storage_adapters.memory import MemoryStore
from txn import GarbageCollector


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.prunes: list[tuple[str, int]] = []

    def prune_cells(self, table: str, below_ts: int) -> int:
        self.prunes.append((table, below_ts))
        return super().prune_cells(table, below_ts)


class _Oracle:
    def __init__(self) -> None:
        self.ts = 100

    def next_timestamp(self) -> int:
        self.ts += 1
        return self.ts


def test_a_collector_prunes_each_table_at_its_first_pass_then_every_prune_every_s() -> None:
    store = _CountingStore()
    store.put_versions("a", [VersionWrite(b"r", b"c", 5, b"v")])
    store.put_versions("b", [VersionWrite(b"r", b"c", 6, b"v")])
    now = [1000.0]
    collector = GarbageCollector(
        store,
        timestamps=_Oracle(),
        retention_s=0,
        grace_ms=0,
        prune_every_s=60,
        monotonic=lambda: now[0],
        sleep=lambda s: None,
    )
    first = collector.run_once()
    assert [t for t, _ in store.prunes] == ["a", "b"]
    assert all(below == first.safe_point for _, below in store.prunes)
    now[0] += 59
    collector.run_once()
    assert len(store.prunes) == 2  # not yet due
    now[0] += 1
    third = collector.run_once()
    assert store.prunes[2:] == [("a", third.safe_point), ("b", third.safe_point)]
    # A new collector (percolake gc, a restarted gateway) prunes at its first pass.
    GarbageCollector(
        store, timestamps=_Oracle(), retention_s=0, grace_ms=0, sleep=lambda s: None
    ).run_once()
    assert len(store.prunes) == 6
