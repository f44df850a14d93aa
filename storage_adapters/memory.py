"""The in-memory reference backend: ``memory://``. Not durable."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from sortedcontainers import SortedDict

from storage_adapters._base import (
    MAX_TIMESTAMP,
    CasResult,
    Cell,
    Claim,
    KVStore,
    ScanEntry,
    StoreClaimedError,
    Version,
    VersionStamp,
    VersionWrite,
    check_cells,
    check_deletes,
    check_limit,
    check_role,
    check_scan,
    check_stamps,
    check_system_key,
    check_system_write,
    check_table,
    check_ts,
    check_writes,
)

# One cell's versions: ts -> value. Cells hold few versions, so a plain dict that is
# sorted on demand is cheaper than keeping a sorted structure per cell.
_Versions = dict[int, bytes | None]


class MemoryStore(KVStore):
    """Reference implementation of :class:`KVStore` over sorted dictionaries.

    A single lock makes every call atomic, which is stronger than the interface
    promises; the contract suite checks only what the interface promises.
    """

    def __init__(self, url: str = "memory://") -> None:
        self._url = url
        self._lock = threading.Lock()
        self._tables: dict[str, SortedDict] = {}  # table -> SortedDict[Cell, _Versions]
        self._system: dict[str, dict[bytes, bytes]] = {}
        #: Commit stamps: table -> (row, column, ts) -> commit_ts, for existing versions.
        self._stamps: dict[str, dict[tuple[bytes, bytes, int], int]] = {}
        self._claims: dict[str, Claim] = {}
        self._closed = False

    def _cells_of(self, table: str) -> SortedDict:
        cells = self._tables.get(table)
        if cells is None:
            cells = self._tables[table] = SortedDict()
        return cells

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("store is closed")

    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        check_table(table)
        writes = check_writes(versions)
        with self._lock:
            self._check_open()
            cells = self._cells_of(table)
            for v in writes:
                key = Cell(v.row, v.column)
                per_cell = cells.get(key)
                if per_cell is None:
                    per_cell = cells[key] = {}
                per_cell[v.ts] = v.value

    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        out: dict[Cell, Version] = {}
        with self._lock:
            self._check_open()
            stored = self._tables.get(table)
            if stored is None:
                return out
            stamps = self._stamps.get(table, {})
            for cell in wanted:
                version = _newest_below(stored.get(cell), below_ts)
                if version is not None:
                    out[cell] = version._replace(commit_ts=stamps.get((*cell, version.ts)))
        return out

    def _scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        cursor = Cell(start_row, start_column)
        inclusive = True
        while True:
            page: list[ScanEntry] = []
            with self._lock:
                self._check_open()
                stored = self._tables.get(table)
                if stored is None:
                    return
                keys = stored.irange(minimum=cursor, inclusive=(inclusive, False))
                stamps = self._stamps.get(table, {})
                last: Cell | None = None
                for key in keys:
                    if end_row is not None and key.row >= end_row:
                        break
                    last = key
                    version = _newest_below(stored[key], below_ts)
                    if version is not None:
                        stamp = stamps.get((key.row, key.column, version.ts))
                        page.append(
                            ScanEntry(key.row, key.column, version.ts, version.value, stamp)
                        )
                    if len(page) >= page_size:
                        break
            yield from page
            if last is None or len(page) < page_size:
                return
            cursor, inclusive = last, False

    def get_version_timestamps(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        above_ts: int = -1,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[int]]:
        check_table(table)
        wanted = check_cells(cells)
        # Any int is a bound (the interval is open and exact); anything else is refused
        # here as on every backend, not compared by accident (True < 2 holds).
        for name, bound in (("above_ts", above_ts), ("below_ts", below_ts)):
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise TypeError(f"{name} must be int, got {type(bound).__name__}")
        limit = check_limit(limit)
        out: dict[Cell, list[int]] = {}
        with self._lock:
            self._check_open()
            stored = self._tables.get(table)
            if stored is None:
                return out
            for cell in wanted:
                per_cell = stored.get(cell)
                if not per_cell:
                    continue
                tss = sorted((ts for ts in per_cell if above_ts < ts < below_ts), reverse=True)
                if limit is not None:
                    tss = tss[:limit]
                if tss:
                    out[cell] = tss
        return out

    def sweep_candidates(
        self,
        table: str,
        below_ts: int,
        stamped_below: int,
        *,
        start_row: bytes = b"",
        start_column: bytes = b"",
        page_size: int = 1000,
    ) -> Iterator[Cell]:
        page_size = check_scan(table, start_row, None, below_ts, start_column, page_size)
        check_ts("stamped_below", stamped_below)
        return self._sweep_candidates(
            table, below_ts, stamped_below, Cell(start_row, start_column), page_size
        )

    def _sweep_candidates(
        self, table: str, below_ts: int, stamped_below: int, cursor: Cell, page_size: int
    ) -> Iterator[Cell]:
        inclusive = True
        while True:
            page: list[Cell] = []
            last: Cell | None = None
            with self._lock:
                self._check_open()
                stored = self._tables.get(table)
                if stored is None:
                    return
                stamps = self._stamps.get(table, {})
                for key in stored.irange(minimum=cursor, inclusive=(inclusive, False)):
                    last = key
                    below = [ts for ts in stored[key] if ts < below_ts]
                    if not below:
                        continue
                    stamp = stamps.get((key.row, key.column, below[0]))
                    settled = (
                        len(below) == 1
                        and stamp is not None
                        and stamp < stamped_below
                        and stored[key][below[0]] is not None
                    )
                    if not settled:
                        page.append(key)
                        if len(page) >= page_size:
                            break
            yield from page
            if last is None or len(page) < page_size:
                return
            cursor, inclusive = last, False

    def get_versions(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[Version]]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        limit = check_limit(limit)
        out: dict[Cell, list[Version]] = {}
        with self._lock:
            self._check_open()
            stored = self._tables.get(table)
            if stored is None:
                return out
            stamps = self._stamps.get(table, {})
            for cell in wanted:
                per_cell = stored.get(cell) or {}
                tss = sorted((ts for ts in per_cell if ts < below_ts), reverse=True)[:limit]
                if tss:
                    out[cell] = [Version(ts, per_cell[ts], stamps.get((*cell, ts))) for ts in tss]
        return out

    def stamp_versions(self, table: str, stamps: Sequence[VersionStamp]) -> None:
        check_table(table)
        wanted = check_stamps(stamps)
        with self._lock:
            self._check_open()
            stored = self._tables.get(table)
            if stored is None:
                return
            table_stamps = self._stamps.setdefault(table, {})
            for s in wanted:
                per_cell = stored.get(Cell(s.row, s.column))
                if per_cell is not None and s.ts in per_cell:
                    table_stamps[s.row, s.column, s.ts] = s.commit_ts

    def tables(self) -> list[str]:
        with self._lock:
            self._check_open()
            return sorted(self._tables)

    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        check_table(table)
        doomed = check_deletes(versions)
        with self._lock:
            self._check_open()
            stored = self._tables.get(table)
            if stored is None:
                return
            stamps = self._stamps.get(table, {})
            for cell, ts in doomed:
                stamps.pop((*cell, ts), None)
                per_cell = stored.get(cell)
                if per_cell is None:
                    continue
                per_cell.pop(ts, None)
                if not per_cell:
                    del stored[cell]

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        check_system_write(table, key, value)
        with self._lock:
            self._check_open()
            rows = self._system.setdefault(table, {})
            existing = rows.get(key)
            if existing is not None:
                return CasResult(False, existing)
            rows[key] = value
            return CasResult(True, value)

    def compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> CasResult:
        check_system_write(table, key, value, expected=expected)
        with self._lock:
            self._check_open()
            rows = self._system.setdefault(table, {})
            current = rows.get(key)
            if current != expected:
                return CasResult(False, current)
            rows[key] = value
            return CasResult(True, value)

    def get_system(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        check_table(table)
        wanted = [check_system_key(table, k) for k in keys]
        with self._lock:
            self._check_open()
            rows = self._system.get(table, {})
            return {k: rows[k] for k in wanted if k in rows}

    def delete_system(self, table: str, key: bytes, expected: bytes) -> CasResult:
        check_system_write(table, key, expected)
        with self._lock:
            self._check_open()
            rows = self._system.get(table, {})
            current = rows.get(key)
            if current != expected:
                return CasResult(False, current)
            del rows[key]
            return CasResult(True, None)

    def claim(self, role: str) -> Claim:
        """Exclusive per store object: a ``memory://`` store lives in one process only."""
        check_role(role)
        with self._lock:
            self._check_open()
            if role in self._claims:
                raise StoreClaimedError(
                    f"{role} of {self.url} (object {id(self):#x}) is already claimed "
                    "in this process",
                    role=role,
                    holder="this process",
                    where=f"{self.url} object {id(self):#x}",
                )
            claim = Claim(
                role, self.url, exclusive=True, on_release=lambda: self._unclaim(role, claim)
            )
            self._claims[role] = claim
            return claim

    def _unclaim(self, role: str, claim: Claim) -> None:
        with self._lock:
            if self._claims.get(role) is claim:
                del self._claims[role]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            claims = list(self._claims.values())
        for claim in claims:
            claim.release()


def _newest_below(per_cell: _Versions | None, below_ts: int) -> Version | None:
    if not per_cell:
        return None
    older = [ts for ts in per_cell if ts < below_ts]
    if not older:
        return None
    ts = max(older)
    return Version(ts, per_cell[ts])
