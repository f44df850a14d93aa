"""A transaction's point reads, one table or several at once: its own buffered writes
answer first, the store the rest, at the transaction's snapshot.

Kept apart from ``EmbeddedTransaction`` so that reading several tables in one store
round (``Transaction.get_many_of_tables``, a group commit's head and job marks) adds no
second copy of the read path: ``get`` and ``get_many`` go through the same functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage_adapters import Cell, StoreError
from txn._buffer import WriteBuffer
from txn.errors import ServiceUnavailableError
from wire import metrics

if TYPE_CHECKING:
    from txn._runtime import Runtime


def split_buffered(
    writes: WriteBuffer, table: str, cells: list[Cell]
) -> tuple[dict[Cell, bytes], list[Cell]]:
    """The transaction's own writes of ``cells`` (its deletes left out), and the cells it
    did not write, which the store must answer; each cell once."""
    out: dict[Cell, bytes] = {}
    from_store = []
    for cell in dict.fromkeys(cells):
        buffered, value = writes.lookup(table, cell)
        if buffered:
            if value is not None:
                out[cell] = value
        else:
            from_store.append(cell)
    return out, from_store


def read_visible(
    rt: Runtime, start_ts: int, reads: list[tuple[str, list[Cell]]]
) -> list[dict[Cell, bytes | None]]:
    """What the store shows of each ``(table, cells)`` at ``start_ts`` (``None``: deleted).

    One table is read as it always was (``SnapshotReader.read_cells``); several go to
    the store in one call (``read_cells_of_tables``), each resolved as ``read_cells``
    resolves it. The GC guard checks after the read (rule S8); a store failure is the
    transaction's ``ServiceUnavailableError``, naming the tables.
    """
    try:
        if len(reads) == 1:
            ((table, cells),) = reads
            found = [rt.reader.read_cells(table, cells, start_ts)]
        else:
            found = rt.reader.read_cells_of_tables(reads, start_ts)
        rt.guard.check(start_ts)  # after the read (rule S8)
    except StoreError as exc:
        metrics.record_store_error("read")
        names = ", ".join(repr(table) for table, _ in reads)
        raise ServiceUnavailableError(f"read of {names} failed: {exc}") from exc
    return found
