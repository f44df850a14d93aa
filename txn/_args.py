"""Argument checks shared by both managers: one place, the same errors (CONTRACT.md).

Everything here raises ``TypeError``/``ValueError`` naming the problem, before any
I/O and before anything is buffered; a gateway runs the same checks again on what it
receives. Cells and values are held to the store's limits (``storage_adapters._base``:
``MAX_CELL_KEY_BYTES``, ``MAX_VALUE_BYTES``), with the store's own ``ValueError``, so a
cell no backend can store is refused when it is put or read, not when the commit
writes it. A cell must also fit the lock its commit takes (``_services.cell_lock``,
at most the lock server's 4,096-byte descriptor), which today is the tighter limit on
row + column; reads are held to it too, so that one rule says which cells a
transaction can use (no transaction can write a longer one). Scan bounds may have any
length.
"""

from __future__ import annotations

from collections.abc import Iterable

from lockserver._table import MAX_DESCRIPTOR_BYTES
from storage_adapters import Cell, check_table
from storage_adapters._base import check_cell as check_store_cell
from storage_adapters._base import check_key, check_value
from txn._isolation import Isolation
from txn._services import cell_lock


def check_cell(table: object, row: object, column: object) -> Cell:
    return _check_lockable(check_table(table), check_store_cell(row, column))


def _check_lockable(table: str, cell: Cell) -> Cell:
    """Refuse a cell whose commit could not lock it (the commit would abort every time)."""
    descriptor = len(cell_lock(table, cell.row, cell.column))
    if descriptor > MAX_DESCRIPTOR_BYTES:
        overhead = descriptor - len(cell.row) - len(cell.column)
        raise ValueError(
            f"row and column are {len(cell.row) + len(cell.column)} bytes together; a "
            f"transaction's cell in table {table!r} holds at most "
            f"{MAX_DESCRIPTOR_BYTES - overhead}: its lock descriptor ({overhead} bytes + row "
            f"+ column) must fit the lock server's {MAX_DESCRIPTOR_BYTES} bytes"
        )
    return cell


def check_put(table: object, row: object, column: object, value: object) -> Cell:
    cell = check_cell(table, row, column)
    check_value(value)
    return cell


def check_cells(table: object, cells: Iterable[tuple[bytes, bytes]]) -> list[Cell]:
    table = check_table(table)
    if isinstance(cells, tuple | bytes | str):
        raise TypeError("cells must be an iterable of (row, column) tuples")
    wanted = []
    for pair in cells:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"a cell must be a (row, column) tuple, got {pair!r}")
        wanted.append(_check_lockable(table, check_store_cell(pair[0], pair[1])))
    return wanted


def check_scan(table: object, start_row: object, end_row: object) -> None:
    check_table(table)
    check_key("start_row", start_row, allow_empty=True)
    if end_row is not None:
        check_key("end_row", end_row, allow_empty=True)


def check_isolation(isolation: object) -> Isolation:
    if not isinstance(isolation, Isolation):
        raise TypeError(f"isolation must be an Isolation, got {isolation!r}")
    return isolation


def check_txn_id(txn_id: object) -> str:
    if not isinstance(txn_id, str) or not txn_id:
        raise ValueError(f"txn_id must be a non-empty str, got {txn_id!r}")
    return txn_id
