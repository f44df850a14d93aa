"""How a collector prunes dead cells (issue 27). ``KVStore.prune_cells`` reads a
table's whole index on Cassandra, so a collector prunes each table at most every
``prune_every_s``, always at its first pass, with the pass's safe point. Between full
prunes a pass prunes the cells it emptied: it names to ``KVStore.prune_emptied_cells``
exactly the cells whose every version below the safe point it deleted, not a cell that
keeps one, and makes no such call at a full prune."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from storage_adapters import Cell, VersionStamp, VersionWrite
from storage_adapters.memory import MemoryStore
from txn import GarbageCollector

pytestmark = pytest.mark.unit


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.prunes: list[tuple[str, int]] = []
        self.named: list[tuple[str, int, list[Cell]]] = []

    def prune_cells(self, table: str, below_ts: int) -> int:
        self.prunes.append((table, below_ts))
        return super().prune_cells(table, below_ts)

    def prune_emptied_cells(self, table: str, below_ts: int, cells: Sequence[Cell]) -> int:
        self.named.append((table, below_ts, sorted(cells)))
        return super().prune_emptied_cells(table, below_ts, cells)


class _Oracle:
    def __init__(self) -> None:
        self.ts = 100

    def next_timestamp(self) -> int:
        self.ts += 1
        return self.ts


def _collector(store: MemoryStore, now: list[float]) -> GarbageCollector:
    """A collector at retention 0 that prunes fully every 60 s of the clock ``now[0]``."""
    return GarbageCollector(
        store,
        timestamps=_Oracle(),
        retention_s=0,
        grace_ms=0,
        prune_every_s=60,
        monotonic=lambda: now[0],
        sleep=lambda s: None,
    )


def test_a_collector_prunes_each_table_at_its_first_pass_then_every_prune_every_s() -> None:
    store = _CountingStore()
    store.put_versions("a", [VersionWrite(b"r", b"c", 5, b"v")])
    store.put_versions("b", [VersionWrite(b"r", b"c", 6, b"v")])
    now = [1000.0]
    collector = _collector(store, now)
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


def test_a_pass_names_the_cells_it_emptied_when_no_full_prune_is_due() -> None:
    store = _CountingStore()
    now = [0.0]
    collector = _collector(store, now)
    store.put_versions("a", [VersionWrite(b"seed", b"c", 1, b"v")])
    store.stamp_versions("a", [VersionStamp(b"seed", b"c", 1, 2)])
    collector.run_once()
    assert [t for t, _ in store.prunes] == ["a"] and store.named == []
    # A value deleted by a committed delete; a value kept; a writer that never
    # committed (no entry: settled aborted); a cell rewritten (its old value goes).
    store.put_versions(
        "a",
        [
            VersionWrite(b"gone", b"c", 10, b"v"),
            VersionWrite(b"gone", b"c", 20, None),
            VersionWrite(b"kept", b"c", 10, b"v"),
            VersionWrite(b"aborted", b"c", 30, b"v"),
            VersionWrite(b"rewritten", b"c", 10, b"old"),
            VersionWrite(b"rewritten", b"c", 20, b"new"),
        ],
    )
    store.stamp_versions(
        "a",
        [
            VersionStamp(b"gone", b"c", 10, 11),
            VersionStamp(b"gone", b"c", 20, 21),
            VersionStamp(b"kept", b"c", 10, 11),
            VersionStamp(b"rewritten", b"c", 10, 11),
            VersionStamp(b"rewritten", b"c", 20, 21),
        ],
    )
    now[0] += 1
    report = collector.run_once()
    assert [t for t, _ in store.prunes] == ["a"]
    assert store.named == [("a", report.safe_point, [Cell(b"aborted", b"c"), Cell(b"gone", b"c")])]
    assert store.get_versions("a", [(b"gone", b"c"), (b"aborted", b"c")]) == {}
    # Nothing emptied: no call; the full prune when due.
    now[0] += 1
    collector.run_once()
    assert len(store.named) == 1
    now[0] += 60
    collector.run_once()
    assert [t for t, _ in store.prunes] == ["a", "a"] and len(store.named) == 1
