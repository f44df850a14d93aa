"""Between full prunes a pass prunes the cells it emptied (issue 27): a collector names
to ``KVStore.prune_emptied_cells`` exactly the cells whose every version below the safe
point it deleted, not a cell that keeps one, and makes no such call at a full prune."""

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
        self.full: list[str] = []
        self.named: list[tuple[str, int, list[Cell]]] = []

    def prune_cells(self, table: str, below_ts: int) -> int:
        self.full.append(table)
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


def test_a_pass_names_the_cells_it_emptied_when_no_full_prune_is_due() -> None:
    store = _CountingStore()
    now = [0.0]
    collector = GarbageCollector(
        store,
        timestamps=_Oracle(),
        retention_s=0,
        grace_ms=0,
        prune_every_s=60,
        monotonic=lambda: now[0],
        sleep=lambda s: None,
    )
    store.put_versions("a", [VersionWrite(b"seed", b"c", 1, b"v")])
    store.stamp_versions("a", [VersionStamp(b"seed", b"c", 1, 2)])
    collector.run_once()
    assert store.full == ["a"] and store.named == []
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
    assert store.full == ["a"]
    assert store.named == [("a", report.safe_point, [Cell(b"aborted", b"c"), Cell(b"gone", b"c")])]
    assert store.get_versions("a", [(b"gone", b"c"), (b"aborted", b"c")]) == {}
    # Nothing emptied: no call; the full prune when due.
    now[0] += 1
    collector.run_once()
    assert len(store.named) == 1
    now[0] += 60
    collector.run_once()
    assert store.full == ["a", "a"] and len(store.named) == 1
