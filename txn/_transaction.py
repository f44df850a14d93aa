"""A transaction: reads at its start timestamp, buffered writes, explicit states."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from lockserver import LockToken
from storage_adapters import Cell, StoreError
from tso import OracleFencedError
from txn._args import check_cell, check_cells, check_put, check_reads, check_scan
from txn._buffer import WriteBuffer
from txn._cell_reads import read_visible, split_buffered
from txn._committer import CommitAttempt, release_all
from txn._isolation import Isolation, TransactionStatus
from txn._services import cell_lock
from txn.errors import (
    DeadlockError,
    ServiceUnavailableError,
    TransactionClosedError,
    TransactionConflictError,
)
from wire import metrics

if TYPE_CHECKING:
    from txn._runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ScanRecord:
    """A scanned range as far as it was iterated, and what the store showed in it."""

    table: str
    start_row: bytes
    end_row: bytes | None
    observed: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)
    #: Last position handed to the caller; ``None`` before the first item.
    upto: Cell | None = None
    exhausted: bool = False


@dataclass(slots=True)
class ReadSet:
    """What a SERIALIZABLE transaction read from the store, re-validated at commit."""

    cells: dict[tuple[str, Cell], bytes | None] = field(default_factory=dict)
    scans: list[ScanRecord] = field(default_factory=list)


def _pull(
    rows: Iterator[tuple[bytes, bytes, bytes | None]], table: str, rt: Runtime, start_ts: int
) -> tuple[bytes, bytes, bytes | None] | None:
    """The next row of a store scan; a store failure is a transaction error, as in ``get``.

    Checked against the garbage-collection safe point after the read (rule S8).
    """
    try:
        row = next(rows, None)
        rt.guard.check(start_ts)
    except StoreError as exc:
        metrics.record_store_error("scan")
        raise ServiceUnavailableError(f"scan of {table!r} failed: {exc}") from exc
    return row


class EmbeddedTransaction:
    """One transaction of an embedded manager. Belongs to one thread; see ``txn.Transaction``.

    ``pessimistic``: every ``get`` is a ``get_for_update`` (``tm.run(fn, pessimistic=True)``).
    """

    def __init__(
        self, runtime: Runtime, start_ts: int, isolation: Isolation, *, pessimistic: bool = False
    ) -> None:
        self._rt = runtime
        self.start_ts = start_ts
        self.isolation = isolation
        self.pessimistic = pessimistic
        #: ``for_update_ts`` of each cell locked by ``get_for_update`` (the first one):
        #: the commit's conflict check reads older writers of the cell from there.
        self._for_update: dict[tuple[str, Cell], int] = {}
        #: Locked cells a writer that began after us committed to: no write of ours to
        #: them can commit (see ``_read_locked``).
        self._doomed: set[tuple[str, Cell]] = set()
        #: The grants of those locks, released when the transaction ends.
        self._held: list[LockToken] = []
        self._status = TransactionStatus.ACTIVE
        self._read_only_commit_ts: int | None = None
        #: Once handed over, the commit owns the outcome; see ``status``.
        self._commit: CommitAttempt | None = None
        self._writes = WriteBuffer()
        self._reads = ReadSet() if isolation is Isolation.SERIALIZABLE else None
        self.scans_started = 0

    @property
    def id(self) -> str:
        """Opaque identifier, unique across every manager on the same store."""
        return str(self.start_ts)

    @property
    def status(self) -> TransactionStatus:
        return self._status if self._commit is None else self._commit.status

    @property
    def commit_ts(self) -> int | None:
        """The commit timestamp once committed, else ``None``."""
        if self._commit is None:
            return self._read_only_commit_ts
        return (
            self._commit.commit_ts if self._commit.status is TransactionStatus.COMMITTED else None
        )

    def __repr__(self) -> str:
        return f"<EmbeddedTransaction {self.id} {self.isolation.value} {self.status.value}>"

    def _check_active(self) -> None:
        if self.status is not TransactionStatus.ACTIVE:
            raise TransactionClosedError(
                f"transaction {self.id} is {self.status.value}; start a new one"
            )

    # --- reads ---------------------------------------------------------------------

    def get(self, table: str, row: bytes, column: bytes) -> bytes | None:
        """The cell's value at this transaction's snapshot, own writes included.

        In a pessimistic transaction this is :meth:`get_for_update`.
        """
        if self.pessimistic:
            return self.get_for_update(table, row, column)
        cell = check_cell(table, row, column)
        return self._get_cells(table, [cell]).get(cell)

    def get_for_update(self, table: str, row: bytes, column: bytes) -> bytes | None:
        """Lock the cell (waiting in the lock server's queue) and return its latest
        committed value, or this transaction's own write of it.

        The value is read at a fresh timestamp, ``for_update_ts``, taken once the lock
        is held, so it includes every commit before the lock was granted; the commit
        then checks for writers of the cell from there, not from ``start_ts``
        (docs/design/protocol.md, "Pessimistic reads"). A lock-wait timeout raises
        :class:`~txn.errors.TransactionConflictError`, a deadlock
        :class:`~txn.errors.DeadlockError`; both abort the transaction.
        """
        cell = check_cell(table, row, column)
        self._check_active()
        key = (table, cell)
        fresh = key not in self._for_update
        if fresh:
            self._lock_for_update(table, cell)
            try:
                self._for_update[key] = self._rt.timestamps.next_timestamp()
            except (StoreError, OracleFencedError) as exc:
                raise ServiceUnavailableError(f"no for_update timestamp: {exc}") from exc
        for_update_ts = self._for_update[key]
        buffered, value = self._writes.lookup(table, cell)
        if not buffered:
            return self._read_locked(table, cell, for_update_ts)
        if fresh:
            # Our own write is the answer, but the read still tells whether it can commit.
            self._read_locked(table, cell, for_update_ts)
            if key in self._doomed:
                self._conflict_on_write(table, cell)
        return value

    def _lock_for_update(self, table: str, cell: Cell) -> None:
        """Take the cell's lock as this transaction's (the owner its commit locks as, so
        the commit's own lock step is granted at once: locks are reentrant per owner)."""
        wait_ms = self._rt.config.lock_wait_ms
        try:
            token = self._rt.locks.lock(
                [cell_lock(table, cell.row, cell.column)],
                str(self.start_ts),
                self._rt.config.lease_ms,
                wait_timeout_ms=wait_ms,
                priority=self.start_ts,  # the oldest waiter first: it can still commit
            )
        except DeadlockError:
            self._end("deadlock")
            raise
        if token is None:
            self._end("lock_timeout")
            raise TransactionConflictError(
                f"lock-wait timeout: transaction {self.start_ts} waited {wait_ms} ms "
                f"(lock_wait_ms) for the lock of {table!r} cell {cell.row!r}/{cell.column!r}, "
                "held by another transaction; it was aborted"
            )
        self._held.append(token)
        metrics.PESSIMISTIC_LOCKS.inc()

    def _read_locked(self, table: str, cell: Cell, for_update_ts: int) -> bytes | None:
        """The cell's newest committed value below ``for_update_ts``.

        Also notes whether its writer began after us: then no write of ours to the cell
        can commit (our version would sort below one that committed before us; see
        docs/design/protocol.md, "Pessimistic reads"), and a ``put`` or ``delete`` of it
        raises at once instead of at commit. A transaction that only reads it is not
        concerned.
        """
        writers: dict[Cell, int] = {}
        try:
            found = self._rt.reader.read_cells(table, [cell], for_update_ts, writers=writers)
            self._rt.guard.check(self.start_ts)  # after the read (rule S8)
        except StoreError as exc:
            metrics.record_store_error("read")
            raise ServiceUnavailableError(f"read of {table!r} failed: {exc}") from exc
        if writers.get(cell, -1) > self.start_ts:
            self._doomed.add((table, cell))
        value = found.get(cell)
        self._record_read(table, cell, value)  # validated at commit_ts like every read
        return value

    def _record_read(self, table: str, cell: Cell, value: bytes | None) -> None:
        """SERIALIZABLE: remember what a read returned, for step 5 to validate.

        A cell read at ``start_ts`` and again, locked, at ``for_update_ts`` may have
        returned two values; the commit re-reads one value at ``commit_ts``, so at least
        one of them cannot be validated, and keeping either would let the other go
        unchecked. Such a transaction aborts here with a serialization failure.
        """
        if self._reads is None:
            return
        key = (table, cell)
        if key in self._reads.cells and self._reads.cells[key] != value:
            self._end("validation")
            raise TransactionConflictError(
                f"serialization failure: {table!r} cell {cell.row!r}/{cell.column!r} read "
                f"differently at {self.start_ts} and, locked, at {self._for_update.get(key)}"
            )
        self._reads.cells[key] = value

    def _conflict_on_write(self, table: str, cell: Cell) -> None:
        self._end("conflict")
        raise TransactionConflictError(
            f"write-write conflict in {table!r}: a transaction that began after "
            f"{self.start_ts} committed cell {cell.row!r}/{cell.column!r} before this one "
            "locked it; this transaction cannot write it and was aborted"
        )

    def get_many(
        self, table: str, cells: Iterable[tuple[bytes, bytes]]
    ) -> dict[tuple[bytes, bytes], bytes]:
        """Values of many cells in one round trip; absent or deleted cells left out."""
        wanted = check_cells(table, cells)
        found = self._get_cells(table, wanted)
        return {(c.row, c.column): v for c, v in found.items()}

    def get_many_of_tables(
        self, reads: Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]
    ) -> list[dict[tuple[bytes, bytes], bytes]]:
        """:meth:`get_many` of each ``(table, cells)``, in the order of ``reads``: the
        store is asked for every table's cells in one round trip.

        The same reads at the same snapshot as one ``get_many`` per table (own writes
        included, each cell recorded for a SERIALIZABLE commit's validation); only the
        number of round trips differs. Like ``get_many``, it locks nothing.
        """
        wanted = check_reads(reads)
        return [
            {(c.row, c.column): v for c, v in found.items()}
            for found in self._get_cells_of_tables(wanted)
        ]

    def _get_cells(self, table: str, cells: list[Cell]) -> dict[Cell, bytes]:
        return self._get_cells_of_tables([(table, cells)])[0]

    def _get_cells_of_tables(self, reads: list[tuple[str, list[Cell]]]) -> list[dict[Cell, bytes]]:
        """Each table's cells: own writes first, the rest from the store in one read."""
        self._check_active()
        outs: list[dict[Cell, bytes]] = []
        asked: list[tuple[int, str, list[Cell]]] = []  # (index in reads, table, cells)
        for index, (table, cells) in enumerate(reads):
            out, from_store = split_buffered(self._writes, table, cells)
            outs.append(out)
            if from_store:
                asked.append((index, table, from_store))
        if asked:
            found = read_visible(self._rt, self.start_ts, [(t, c) for _, t, c in asked])
            for (index, table, cells), visible in zip(asked, found, strict=True):
                for cell in cells:
                    self._record_read(table, cell, visible.get(cell))
                outs[index].update((c, v) for c, v in visible.items() if v is not None)
        return outs

    def scan(
        self, table: str, start_row: bytes = b"", end_row: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes, bytes]]:
        """``(row, column, value)`` for ``start_row <= row < end_row``, sorted, own writes in."""
        check_scan(table, start_row, end_row)
        self._check_active()
        record = ScanRecord(table, start_row, end_row)
        if self._reads is not None:
            self._reads.scans.append(record)
        self.scans_started += 1
        return self._scan(record)

    def limit_scan(self, scan_id: int, last: Cell | None, exhausted: bool) -> None:
        """Narrow what a SERIALIZABLE commit validates of scan ``scan_id`` to what the
        client consumed (a gateway reads ahead of its client)."""
        if self._reads is None:
            return
        if not 0 <= scan_id < len(self._reads.scans):
            raise ValueError(f"no scan {scan_id} in transaction {self.id}")
        record = self._reads.scans[scan_id]
        if exhausted and record.exhausted:
            return
        if last is not None and record.upto is not None and last > record.upto:
            raise ValueError(f"scan {scan_id} was not read as far as {last!r}")
        record.exhausted = False
        record.upto = last

    def _scan(self, record: ScanRecord) -> Iterator[tuple[bytes, bytes, bytes]]:
        stored = self._rt.reader.scan(
            record.table,
            record.start_row,
            record.end_row,
            self.start_ts,
            page_size=self._rt.config.scan_page_size,
        )
        next_stored = _pull(stored, record.table, self._rt, self.start_ts)
        cursor: Cell | None = None
        while True:
            self._check_active()
            # The store side is fixed at start_ts; our own writes may change between
            # two pulls (this thread, or an attached executor through the gateway), so
            # the next buffered cell is looked up afresh after the cursor every time.
            buffered = self._writes.first_from(
                record.table, cursor, record.start_row, record.end_row
            )
            if next_stored is None and buffered is None:
                break
            stored_cell = None if next_stored is None else Cell(next_stored[0], next_stored[1])
            value: bytes | None
            if buffered is not None and (stored_cell is None or buffered[0] <= stored_cell):
                cell, value = buffered
                if next_stored is not None and cell == stored_cell:
                    self._observe(record, next_stored)  # shadowed by our own write
                    next_stored = _pull(stored, record.table, self._rt, self.start_ts)
            else:
                assert next_stored is not None and stored_cell is not None
                cell, value = stored_cell, next_stored[2]
                self._observe(record, next_stored)
                next_stored = _pull(stored, record.table, self._rt, self.start_ts)
            record.upto = cursor = cell
            if value is not None:
                yield cell.row, cell.column, value
        record.exhausted = True

    @staticmethod
    def _observe(record: ScanRecord, entry: tuple[bytes, bytes, bytes | None]) -> None:
        row, column, value = entry
        if value is not None:
            record.observed.append((row, column, value))

    # --- writes --------------------------------------------------------------------

    def put(self, table: str, row: bytes, column: bytes, value: bytes) -> None:
        """Buffer a write; it becomes visible to others only when the commit succeeds."""
        cell = check_put(table, row, column, value)
        self._check_active()
        if (table, cell) in self._doomed:
            self._conflict_on_write(table, cell)
        self._writes.put(table, cell, value)

    def delete(self, table: str, row: bytes, column: bytes) -> None:
        """Buffer a delete (a tombstone version)."""
        cell = check_cell(table, row, column)
        self._check_active()
        if (table, cell) in self._doomed:
            self._conflict_on_write(table, cell)
        self._writes.put(table, cell, None)

    @property
    def buffered_writes(self) -> int:
        """How many distinct cells this transaction has written so far."""
        return len(self._writes)

    # --- ending --------------------------------------------------------------------

    def commit(self) -> int:
        """Commit and return the commit timestamp (``start_ts`` for read-only ones).

        Raises :class:`~txn.errors.TransactionConflictError` when a concurrent
        transaction won, :class:`~txn.errors.TransactionAbortedError` when it
        definitely did not commit, :class:`~txn.errors.CommitUnknownError` when
        the outcome could not be settled.
        """
        self._check_active()
        if not self._writes:
            # Read-only: the snapshot was consistent; nothing to validate (docs/design/protocol.md).
            # Locked reads at for_update_ts included: a read-only transaction writes no
            # version whose order they could break.
            self._status = TransactionStatus.COMMITTED
            self._read_only_commit_ts = self.start_ts
            self._release_held()
            return self.start_ts
        return self.committer().run()

    def committer(self, *, steps: tuple[str, ...] | None = None) -> CommitAttempt:
        """The commit as explicit steps, for tests that interleave transactions.

        ``commit()`` is ``committer().run()``. ``steps`` defaults to the runtime's
        (``COMMIT_STEPS``, unless a test built the manager with a broken protocol).
        """
        self._check_active()
        held, self._held = tuple(self._held), []
        self._commit = CommitAttempt(
            self._rt,
            self.start_ts,
            self._writes,
            self._reads,
            steps=self._rt.commit_steps if steps is None else steps,
            read_bounds=self._for_update,
            held=held,  # released with the commit's own locks, whatever its outcome
        )
        return self._commit

    def abort(self, *, reason: str = "user") -> None:
        """Drop the buffered writes. Nothing was written to the store before commit.

        ``reason`` is what the metrics count it as (``wire.metrics.ABORT_REASONS``):
        the gateway says why it aborts a transaction its client did not.
        """
        self._check_active()
        self._end(reason)

    def _end(self, reason: str) -> None:
        """Abort: nothing was written; release the locks of ``get_for_update``."""
        self._status = TransactionStatus.ABORTED
        self._release_held()
        metrics.record_abort(reason)

    def _release_held(self) -> None:
        held, self._held = tuple(self._held), []
        release_all(self._rt, held)

    def __enter__(self) -> EmbeddedTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.status is not TransactionStatus.ACTIVE:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()
