"""A transaction's buffered writes, kept sorted per table so that scans can merge them."""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedDict

from storage_adapters import Cell


class WriteBuffer:
    """``(table, row, column) -> value``, where ``None`` is a delete."""

    def __init__(self) -> None:
        self._tables: dict[str, SortedDict] = {}
        self._count = 0

    def put(self, table: str, cell: Cell, value: bytes | None) -> None:
        cells = self._tables.get(table)
        if cells is None:
            cells = self._tables[table] = SortedDict()
        if cell not in cells:
            self._count += 1
        cells[cell] = value

    def lookup(self, table: str, cell: Cell) -> tuple[bool, bytes | None]:
        """``(True, value)`` when the transaction wrote the cell, else ``(False, None)``."""
        cells = self._tables.get(table)
        if cells is None or cell not in cells:
            return False, None
        value: bytes | None = cells[cell]
        return True, value

    def first_from(
        self, table: str, after: Cell | None, start_row: bytes, end_row: bytes | None
    ) -> tuple[Cell, bytes | None] | None:
        """The first buffered cell of ``[start_row, end_row)`` after ``after``, with its value.

        A scan asks afresh for each next cell instead of keeping an iterator over the
        buffer open: the transaction (or an executor attached to it) may write to the
        scanned table between two pulls, and an open iterator over a changed sorted
        dict skips or repeats entries.
        """
        cells = self._tables.get(table)
        if cells is None:
            return None
        if after is None:
            found = cells.irange(minimum=Cell(start_row, b""))
        else:
            found = cells.irange(minimum=after, inclusive=(False, True))
        cell: Cell | None = next(iter(found), None)
        if cell is None or (end_row is not None and cell.row >= end_row):
            return None
        value: bytes | None = cells[cell]
        return cell, value

    def tables(self) -> Iterator[tuple[str, SortedDict]]:
        yield from self._tables.items()

    def __len__(self) -> int:
        return self._count
