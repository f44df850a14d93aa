"""Dropping and renaming tables: each is one transaction over every metadata row.

A table's cells are keyed by its name (``Layout``): its row in ``tables`` and
``head``, and rows under ``Layout.prefix(name)`` in the log, files, generations,
marks, checkpoints and chunks. A drop deletes them all; a rename moves them all to
the new name (the metadata's ``name`` rewritten, its location kept, so the files
stay where they are). Both write the head cell, so a commit racing them conflicts
at the head and, retrying, finds no table of that name: the drop or rename is
atomic against every commit. A rename's transaction is as large as the table's
metadata (its checkpointed state plus the log that retention keeps).

A drop removes no file: a reader that listed the table's files a moment before
still reads them. The drop's transaction records the location instead
(:class:`DroppedTable`, in ``Layout.dropped``, keyed by location); a vacuum of the
name claims the record once its retention has passed (:func:`claim_dropped`) and
only then sweeps the files. A table created at that location later deletes the
record in its own transaction (:func:`replace_dropped`), so the claim and the
create conflict on that one cell and one of them wins (the sweep lists the folders
before its claim, so it never meets a newer table's), and the new table is fenced at
the drop time: no job that started before the drop commits to it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass

from spark_integration.engine.errors import TableExistsError, TableNotFoundError
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
    record = DroppedTable(name, meta.location, max(tables.clock_ms(), head.last_ms))
    tx.put(
        tables.layout.dropped,
        Layout.dropped_row(meta.location),
        Layout.COL_DROPPED,
        record.encode(),
    )
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


@dataclass(frozen=True, slots=True)
class DroppedTable:
    """A dropped table whose files are still at ``location``, for vacuum to remove.

    ``dropped_ms``: the drop's time by the catalog's clock (and at or after the
    table's last log time): the cutoff of the sweep of its files, and the fence of a
    table created at ``location`` later.
    """

    name: str
    location: str
    dropped_ms: int

    def encode(self) -> bytes:
        return json.dumps({"n": self.name, "l": self.location, "ms": self.dropped_ms}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> DroppedTable:
        d = json.loads(raw)
        return cls(str(d["n"]), str(d["l"]), int(d["ms"]))


def dropped_tables(tx: Transaction, layout: Layout) -> list[DroppedTable]:
    """Every drop record of the catalog, at ``tx``'s snapshot."""
    return [
        DroppedTable.decode(value)
        for _, column, value in tx.scan(layout.dropped)
        if column == Layout.COL_DROPPED
    ]


def claim_dropped(
    tx: Transaction, layout: Layout, name: str, cutoff_ms: int
) -> tuple[list[DroppedTable], list[DroppedTable]]:
    """Delete the records of dropped tables named ``name`` dropped at or before
    ``cutoff_ms``; returns them (their files may go now) and the younger ones (kept).

    Raises :class:`TableExistsError` if a table of that name exists (vacuum it as a
    table), and :class:`TableNotFoundError` if no table and no record has the name.
    """
    if tx.get(layout.tables, Layout.name_row(name), Layout.COL_META) is not None:
        raise TableExistsError(f"table {name!r} exists: vacuum it as a table")
    records = [r for r in dropped_tables(tx, layout) if r.name == name]
    if not records:
        raise TableNotFoundError(
            f"no table {name!r} in catalog {layout.catalog!r}, "
            "and no dropped table of that name awaits vacuum"
        )
    due = [r for r in records if r.dropped_ms <= cutoff_ms]
    for r in due:
        tx.delete(layout.dropped, Layout.dropped_row(r.location), Layout.COL_DROPPED)
    return due, [r for r in records if r.dropped_ms > cutoff_ms]


def replace_dropped(tx: Transaction, layout: Layout, meta: TableMeta, over_dropped: bool) -> int:
    """Delete the drop record at the new table ``meta``'s location; returns the fence
    (the drop time, 0 without a record) its head starts with.

    ``over_dropped``: the location holds files, so creating the table is allowed
    only over a drop record (a vacuum that claimed it first is sweeping them).
    """
    row = Layout.dropped_row(meta.location)
    raw = tx.get(layout.dropped, row, Layout.COL_DROPPED)
    if raw is None:
        if over_dropped:
            raise TableExistsError(
                f"location {meta.location} of table {meta.name!r} already holds files and "
                "no dropped table's record covers them; a table never adopts files it did "
                "not write (if a vacuum of the dropped table is removing them, retry after it)"
            )
        return 0
    tx.delete(layout.dropped, row, Layout.COL_DROPPED)
    return DroppedTable.decode(raw).dropped_ms
