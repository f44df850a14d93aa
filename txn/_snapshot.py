"""Snapshot reads: the newest committed version of each cell below a timestamp."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from storage_adapters import Cell, KVStore, ScanEntry, Version
from txn._status import ABORTED, StatusResolver

#: Reports versions of aborted writers found on the way, for asynchronous cleanup.
GarbageSink = Callable[[str, list[tuple[bytes, bytes, int]]], None]


class SnapshotReader:
    """Reads at a snapshot ``r``: a version is visible when its writer committed below ``r``.

    ``skip_ts`` names a writer whose versions are never visible: the reading
    transaction itself, when it re-reads at its commit timestamp (SERIALIZABLE).
    """

    def __init__(self, store: KVStore, resolver: StatusResolver, garbage: GarbageSink) -> None:
        self._store = store
        self._resolver = resolver
        self._garbage = garbage

    def _visible(self, writer_ts: int, outcome: int | None, snapshot_ts: int) -> bool:
        # ABORTED and GONE are negative: never visible.
        return outcome is not None and 0 <= outcome < snapshot_ts

    def read_cells(
        self,
        table: str,
        cells: Sequence[Cell],
        snapshot_ts: int,
        *,
        skip_ts: int | None = None,
        below: dict[Cell, int] | None = None,
        writers: dict[Cell, int] | None = None,
    ) -> dict[Cell, bytes | None]:
        """Visible value of each cell (``None``: deleted); cells never written left out.

        ``below`` starts some cells' search under a lower bound than the snapshot.
        ``writers``, when given, receives the start timestamp of each visible version
        (``get_for_update`` asks whether a writer that began after it committed first).
        """
        bounds = {cell: snapshot_ts for cell in cells}
        if below:
            bounds.update(below)
        out: dict[Cell, bytes | None] = {}
        while bounds:
            groups: dict[int, list[Cell]] = {}
            for cell, bound in bounds.items():
                groups.setdefault(bound, []).append(cell)
            found: dict[Cell, Version] = {}
            for bound, group in groups.items():
                found.update(self._store.get_latest(table, group, bound))
            bounds = self._settle(table, found, snapshot_ts, skip_ts, writers, out)
        return out

    def read_cells_of_tables(
        self, reads: Sequence[tuple[str, Sequence[Cell]]], snapshot_ts: int
    ) -> list[dict[Cell, bytes | None]]:
        """:meth:`read_cells` of each ``(table, cells)`` at ``snapshot_ts``, in the order
        of ``reads``: the first read of every table is one store call
        (``KVStore.get_latest_of_tables``, one round on a networked store).

        Each table's versions are then settled exactly as ``read_cells`` settles them;
        a cell whose newest version is not visible (its writer is pending, aborted, or
        committed at or above the snapshot) is read further down by ``read_cells``
        itself, from that version's timestamp, as its own loop would.
        """
        first = self._store.get_latest_of_tables(
            [(table, list(cells)) for table, cells in reads], snapshot_ts
        )
        outs: list[dict[Cell, bytes | None]] = []
        for (table, _), found in zip(reads, first, strict=True):
            out: dict[Cell, bytes | None] = {}
            older = self._settle(table, found, snapshot_ts, None, None, out)
            if older:
                out.update(self.read_cells(table, list(older), snapshot_ts, below=older))
            outs.append(out)
        return outs

    def _settle(
        self,
        table: str,
        found: dict[Cell, Version],
        snapshot_ts: int,
        skip_ts: int | None,
        writers: dict[Cell, int] | None,
        out: dict[Cell, bytes | None],
    ) -> dict[Cell, int]:
        """Put each found version that is visible at ``snapshot_ts`` into ``out``; report
        aborted ones as garbage. Returns the cells still to read: each with the
        timestamp of its invisible version, to read below next."""
        outcomes = self._outcomes(
            table, [(cell, v.ts, v.commit_ts) for cell, v in found.items()], skip_ts
        )
        next_bounds: dict[Cell, int] = {}
        garbage = []
        for cell, version in found.items():
            outcome = outcomes.get(version.ts)
            if version.ts != skip_ts and self._visible(version.ts, outcome, snapshot_ts):
                out[cell] = version.value
                if writers is not None:
                    writers[cell] = version.ts
                continue
            if outcome == ABORTED:
                garbage.append((cell.row, cell.column, version.ts))
            next_bounds[cell] = version.ts
        if garbage:
            self._garbage(table, garbage)
        return next_bounds

    def _outcomes(
        self, table: str, versions: list[tuple[Cell, int, int | None]], skip_ts: int | None
    ) -> dict[int, int]:
        """Each writer's outcome: a version's commit stamp when it has one (rule S9: no
        lookup), else the transactions table through the resolver."""
        out: dict[int, int] = {}
        where: dict[int, tuple[str, Cell]] = {}
        for cell, ts, commit_ts in versions:
            if ts == skip_ts:
                continue
            if commit_ts is not None:
                out[ts] = commit_ts
            else:
                where.setdefault(ts, (table, cell))
        if where:
            out.update(self._resolver.resolve(where, where=where))
        return out

    def scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        snapshot_ts: int,
        *,
        skip_ts: int | None = None,
        page_size: int = 500,
        start_column: bytes = b"",
    ) -> Iterator[tuple[bytes, bytes, bytes | None]]:
        """Visible versions in ``(row, column)`` order, tombstones included (``None``)."""
        entries = self._store.scan(
            table,
            start_row,
            end_row,
            snapshot_ts,
            start_column=start_column,
            page_size=page_size,
        )
        page: list[ScanEntry] = []
        for entry in entries:
            page.append(entry)
            if len(page) >= page_size:
                yield from self._resolve_page(table, page, snapshot_ts, skip_ts)
                page = []
        if page:
            yield from self._resolve_page(table, page, snapshot_ts, skip_ts)

    def _resolve_page(
        self, table: str, page: list[ScanEntry], snapshot_ts: int, skip_ts: int | None
    ) -> Iterator[tuple[bytes, bytes, bytes | None]]:
        outcomes = self._outcomes(
            table, [(Cell(e.row, e.column), e.ts, e.commit_ts) for e in page], skip_ts
        )
        older: dict[Cell, int] = {}
        garbage = []
        for e in page:
            outcome = outcomes.get(e.ts)
            if e.ts == skip_ts or not self._visible(e.ts, outcome, snapshot_ts):
                older[Cell(e.row, e.column)] = e.ts
                if outcome == ABORTED:
                    garbage.append((e.row, e.column, e.ts))
        if garbage:
            self._garbage(table, garbage)
        resolved = (
            self.read_cells(table, list(older), snapshot_ts, skip_ts=skip_ts, below=older)
            if older
            else {}
        )
        for e in page:
            cell = Cell(e.row, e.column)
            if cell in older:
                if cell in resolved:
                    yield e.row, e.column, resolved[cell]
            else:
                yield e.row, e.column, e.value
