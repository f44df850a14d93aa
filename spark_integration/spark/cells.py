"""One Spark job, one transaction: executors write cells into the driver's transaction.

The driver begins a transaction on a remote manager; every task attaches to it
by id through the gateway (``TransactionManager.remote(address).attach(txn_id)``)
and writes its partition's cells; the driver commits once every task succeeded,
and aborts if the job failed. Readers see all of the job's cells or none.

Task retries and speculative copies write the same cells with the same values,
which is harmless: a transaction's writes to one cell replace each other. That
holds as long as a partition's rows are deterministic (as Spark itself assumes).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Row

from storage_adapters import check_table
from txn import Isolation, Manager, TransactionManager
from txn.errors import TransactionError

log = logging.getLogger(__name__)

#: Turns a column value into cell bytes; ``None`` deletes the cell.
Encoder = Callable[[object], bytes | None]


def encode_value(value: object) -> bytes | None:
    """The default encoder: bytes as they are, text as UTF-8, numbers as their text,
    ``None`` as a delete, anything else as JSON."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool | int | float):
        return json.dumps(value).encode()
    return json.dumps(value, default=str, sort_keys=True).encode()


def encode_row_key(value: object) -> bytes:
    if isinstance(value, bytes | bytearray):
        key = bytes(value)
    elif isinstance(value, str):
        key = value.encode()
    elif isinstance(value, int) and not isinstance(value, bool):
        key = str(value).encode()
    else:
        raise TypeError(f"a row key must be str, bytes or int, got {type(value).__name__}")
    if not key:
        raise ValueError("a row key must not be empty")
    return key


@dataclass(frozen=True, slots=True)
class PartitionWriter:
    """What each task runs (pickled to the executors): attach, write, detach."""

    address: str
    token: str | None
    txn_id: str
    table: str
    row_col: str
    columns: tuple[str, ...]
    encode: Encoder

    def __call__(self, rows: Iterable[Row]) -> None:
        tm = TransactionManager.remote(self.address, token=self.token)
        try:
            tx = tm.attach(self.txn_id)
            written = 0
            for row in rows:
                key = encode_row_key(row[self.row_col])
                for column in self.columns:
                    value = self.encode(row[column])
                    if value is None:
                        tx.delete(self.table, key, column.encode())
                    else:
                        tx.put(self.table, key, column.encode(), value)
                    written += 1
            # An attached transaction may buffer on the executor side; hand the
            # buffered writes to the gateway before the task reports success.
            flush: Any = getattr(tx, "flush", None)
            if callable(flush):
                flush()
            log.debug("task wrote %d cells into transaction %s", written, self.txn_id)
        finally:
            tm.close()


def write_cells(
    df: DataFrame,
    tm: Manager,
    table: str,
    *,
    row_col: str,
    columns: Sequence[str] | None = None,
    address: str | None = None,
    token: str | None = None,
    isolation: Isolation = Isolation.SNAPSHOT,
    encode: Encoder = encode_value,
) -> int:
    """Write every row of ``df`` as cells of percolake ``table`` in ONE transaction.

    Row key: the value of ``row_col``; one cell per column in ``columns`` (default:
    every other column), named by the column, valued by ``encode``. Returns the
    commit timestamp. ``tm`` must be a remote manager and ``address`` the gateway
    address executors can reach (default ``tm.address`` when it has one).
    Raises what the Spark job raised (the transaction is then aborted), or the
    commit's ``TransactionConflictError``/``CommitUnknownError``.
    """
    if not isinstance(df, DataFrame):
        raise TypeError(f"expected a pyspark DataFrame, got {type(df).__name__}")
    check_table(table)
    names = df.schema.fieldNames()
    if row_col not in names:
        raise ValueError(f"row_col {row_col!r} is not a column of the DataFrame ({names})")
    chosen = tuple(c for c in names if c != row_col) if columns is None else tuple(columns)
    if not chosen:
        raise ValueError("no columns to write")
    for column in chosen:
        if column not in names:
            raise ValueError(f"column {column!r} is not a column of the DataFrame ({names})")
        if column == row_col:
            raise ValueError(f"column {column!r} is the row key column")
    gateway = address if address is not None else getattr(tm, "address", None)
    if not isinstance(gateway, str) or not gateway:
        raise ValueError(
            "write_cells needs the address of the percolake gateway that executors can "
            "reach (a remote TransactionManager); pass address='host:port'"
        )
    tx = tm.begin(isolation)
    writer = PartitionWriter(gateway, token, tx.id, table, row_col, chosen, encode)
    try:
        df.foreachPartition(writer)
    except BaseException:
        try:
            tx.abort()
        except TransactionError as exc:
            log.warning("could not abort transaction %s after the job failed: %s", tx.id, exc)
        raise
    commit_ts = tx.commit()
    log.info("write_cells committed %s into %s at %d", tx.id, table, commit_ts)
    return commit_ts
