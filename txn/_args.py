"""Argument checks shared by both managers: one place, the same errors (``txn.Manager``).

Everything here raises ``TypeError``/``ValueError`` naming the problem, before any
I/O and before anything is buffered; a gateway runs the same checks again on what it
receives. Cells and values are held to the store's limits (``storage_adapters._base``:
``MAX_CELL_KEY_BYTES``, ``MAX_VALUE_BYTES``), with the store's own ``ValueError``, so a
cell no backend can store is refused when it is put or read, not when the commit
writes it. (Every such cell can be locked: ``_services.cell_lock`` replaces a long
descriptor by its digest.) Scan bounds may have any length.
"""

from __future__ import annotations

from collections.abc import Iterable

from storage_adapters import Cell, check_scan_bounds, check_table, check_value
from storage_adapters import check_cell as check_store_cell
from storage_adapters import check_cells as check_store_cells
from txn._isolation import Isolation


def check_cell(table: object, row: object, column: object) -> Cell:
    check_table(table)
    return check_store_cell(row, column)


def check_put(table: object, row: object, column: object, value: object) -> Cell:
    cell = check_cell(table, row, column)
    check_value(value)
    return cell


def check_cells(table: object, cells: Iterable[tuple[bytes, bytes]]) -> list[Cell]:
    check_table(table)
    return check_store_cells(cells)


def check_reads(
    reads: Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]],
) -> list[tuple[str, list[Cell]]]:
    """The ``(table, cells)`` pairs of a read of several tables (``get_many_of_tables``),
    each table and its cells checked as :func:`check_cells` checks them."""
    if isinstance(reads, str | bytes) or not isinstance(reads, Iterable):
        raise TypeError(f"reads must be an iterable of (table, cells) pairs, got {reads!r}")
    out: list[tuple[str, list[Cell]]] = []
    for pair in reads:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"each read must be a (table, cells) pair, got {pair!r}")
        table, cells = pair
        out.append((check_table(table), check_cells(table, cells)))
    return out


def check_scan(table: object, start_row: object, end_row: object) -> None:
    check_table(table)
    check_scan_bounds(start_row, end_row)


def check_isolation(isolation: object) -> Isolation:
    if not isinstance(isolation, Isolation):
        raise TypeError(f"isolation must be an Isolation, got {isolation!r}")
    return isolation


def check_txn_id(txn_id: object) -> str:
    if not isinstance(txn_id, str) or not txn_id:
        raise ValueError(f"txn_id must be a non-empty str, got {txn_id!r}")
    return txn_id
