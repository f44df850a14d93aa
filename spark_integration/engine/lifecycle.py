"""Dropping and renaming tables: each is one transaction over every metadata row.

A table's cells are keyed by its name (``Layout``): its row in ``tables`` and
``head``, and rows under ``Layout.prefix(name)`` in the log, files, generations,
marks, checkpoints and chunks. A drop deletes them all; a rename moves them all to
the new name (the metadata's ``name`` rewritten, its location kept, so the files
stay where they are). Both write the head cell, so a commit racing them conflicts
at the head and, retrying, finds no table of that name: the drop or rename is
atomic against every commit. A rename's transaction is as large as the table's
metadata (its checkpointed state plus the log that retention keeps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from spark_integration.engine.errors import TableExistsError
from spark_integration.engine.model import Layout, TableMeta
from spark_integration.engine.table_access import TableAccess
from txn import Transaction

Cell = tuple[str, bytes, bytes, bytes]  # table, row, column, value


def _cells(tx: Transaction, layout: Layout, name: str) -> Iterator[Cell]:
    row = Layout.name_row(name)
    for table in (layout.tables, layout.head):
        for r, column, value in tx.scan(table, row, row + b"\x00"):
            if r == row:
                yield table, r, column, value
    start, end = Layout.prefix(name), Layout.prefix_end(name)
    for table in (
        layout.log,
        layout.files,
        layout.gens,
        layout.marks,
        layout.checkpoints,
        layout.chunks,
    ):
        for r, column, value in tx.scan(table, start, end):
            yield table, r, column, value


def drop(tx: Transaction, tables: TableAccess, name: str) -> TableMeta:
    """Delete every cell of table ``name``; returns its metadata (for its location)."""
    head = tables.read_head(tx, name)  # TableNotFoundError names the table
    meta = tables.read_meta(tx, name, head)
    for table, row, column, _ in list(_cells(tx, tables.layout, name)):
        tx.delete(table, row, column)
    return meta


def rename(tx: Transaction, tables: TableAccess, old: str, new: str) -> None:
    """Move every cell of table ``old`` to ``new``, which must not exist."""
    layout = tables.layout
    tables.read_head(tx, old)  # TableNotFoundError names the table
    if tx.get(layout.tables, Layout.name_row(new), Layout.COL_META) is not None:
        raise TableExistsError(f"cannot rename table {old!r}: table {new!r} already exists")
    old_row, old_prefix = Layout.name_row(old), Layout.prefix(old)
    for table, row, column, value in list(_cells(tx, layout, old)):
        tx.delete(table, row, column)
        if row == old_row:
            moved = Layout.name_row(new)
        else:
            moved = Layout.prefix(new) + row[len(old_prefix) :]
        if table == layout.tables and column == Layout.COL_META:
            tx.put(table, moved, column, _renamed(value, new))
        else:
            tx.put(table, moved, column, value)


def _renamed(raw: bytes, new: str) -> bytes:
    return dataclasses.replace(TableMeta.decode(raw), name=new).encode()
