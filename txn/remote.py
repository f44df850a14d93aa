"""The remote manager: the transaction API (``txn.Manager``) through a percolake gateway.

Writes are buffered here and sent in batches before any read, scan or commit, so a
write-heavy transaction costs few round trips. Safe calls are retried by the channel
on UNAVAILABLE; Commit never is (rule S6): when its reply is lost, the outcome is
settled with Status, and if that fails too the caller gets ``CommitUnknownError``.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from types import TracebackType
from typing import TypeVar

import grpc

from txn._args import (
    check_cell,
    check_cells,
    check_isolation,
    check_put,
    check_reads,
    check_scan,
    check_txn_id,
)
from txn._config import TransactionConfig
from txn._isolation import Isolation, TransactionStatus
from txn._retry import RetryPolicy, run_transaction
from txn.errors import (
    CommitUnknownError,
    NotTransactionOwnerError,
    OutcomeForgottenError,
    TransactionAbortedError,
    TransactionClosedError,
    TransactionError,
    TransactionNotFoundError,
)
from txn.lowering import isolation_from_pb, isolation_to_pb, state_from_pb
from wire.auth import TlsConfig
from wire.channels import Connection, call, stream
from wire.error_codes import RpcError, ServiceUnavailableError
from wire.v1 import transaction_pb2 as pb
from wire.v1 import transaction_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Buffered mutations sent per Write call.
WRITE_BATCH = 2_000
#: Written cells a lost Commit reply's settle names (any one stamped one proves the
#: commit; a sample keeps the request small).
WRITTEN_SAMPLE = 64


class RemoteTransaction:
    """A transaction that lives in a gateway; same API as :class:`txn.Transaction`."""

    def __init__(
        self,
        manager: RemoteTransactionManager,
        txn_id: str,
        start_ts: int,
        isolation: Isolation,
        commit_secret: str | None,
        *,
        pessimistic: bool = False,
    ) -> None:
        self._m = manager
        self.id = txn_id
        self.start_ts = start_ts
        self.isolation = isolation
        #: Every ``get`` is a ``get_for_update`` (``run(fn, pessimistic=True)``).
        self.pessimistic = pessimistic
        self.status = TransactionStatus.ACTIVE
        self.commit_ts: int | None = None
        self._secret = commit_secret
        self._pending: list[pb.Mutation] = []
        self._scans: dict[int, pb.ScanProgress] = {}
        #: Whether this handle sent any write, and a sample of the cells it wrote: once
        #: a lost Commit reply is settled after garbage collection collected the entry,
        #: the commit stamps on these cells say it committed (rule S9).
        self._wrote = False
        self._written: dict[tuple[str, bytes, bytes], None] = {}

    @property
    def attached(self) -> bool:
        """True for a handle from ``attach``: it may read and write, not commit or abort."""
        return self._secret is None

    def __repr__(self) -> str:
        kind = "attached" if self.attached else "remote"
        return f"<RemoteTransaction {self.id} {kind} {self.isolation.value} {self.status.value}>"

    def _call(self, fn: Callable[..., T], request: object) -> T:
        """A call of this transaction. A gateway that does not know it answers "not
        found": the gateway that began it is gone or this client failed over to another
        replica since. Its writes were buffered there and its Commit never ran there, so
        it is definitely not committed: an abort, begun again by whoever retries."""
        try:
            return self._m._call(fn, request)
        except TransactionNotFoundError as exc:
            self.status = TransactionStatus.ABORTED
            raise TransactionAbortedError(
                f"transaction {self.id} is lost: the gateway that answered does not hold it "
                f"(the one that began it stopped, or this client failed over): {exc}"
            ) from exc

    def _check_active(self) -> None:
        if self.status is not TransactionStatus.ACTIVE:
            raise TransactionClosedError(
                f"transaction {self.id} is {self.status.value}; start a new one"
            )

    def flush(self) -> None:
        """Send buffered writes to the gateway (done before every read and the commit)."""
        while self._pending:
            batch, self._pending = self._pending[:WRITE_BATCH], self._pending[WRITE_BATCH:]
            try:
                self._call(
                    self._m._stub.Write,
                    pb.WriteRequest(txn_id=self.id, mutations=batch, attached=self.attached),
                )
            except TransactionAbortedError:
                # The gateway ended the transaction (a write to a locked cell that a
                # writer which began later committed first, or reaped as idle): so
                # does this handle, and nothing buffered will ever be sent.
                self._pending.clear()
                self.status = TransactionStatus.ABORTED
                raise
            except BaseException:
                self._pending[:0] = batch  # nothing of a failed batch was applied
                raise
            self._wrote = True
            for m in batch:
                if len(self._written) >= WRITTEN_SAMPLE:
                    break
                self._written[(m.table, m.row, m.column)] = None

    # --- reads ---------------------------------------------------------------------

    def get(self, table: str, row: bytes, column: bytes) -> bytes | None:
        """The cell's value at the snapshot; in a pessimistic transaction, a locked read."""
        if self.pessimistic:
            return self.get_for_update(table, row, column)
        check_cell(table, row, column)
        self._check_active()
        self.flush()
        got = self._call(
            self._m._stub.Get, pb.GetRequest(txn_id=self.id, table=table, row=row, column=column)
        )
        return got.value if got.found else None

    def get_for_update(self, table: str, row: bytes, column: bytes) -> bytes | None:
        """Lock the cell in the gateway's lock server and return its latest committed
        value (``txn.Transaction.get_for_update``). A lock-wait timeout or a deadlock
        aborted the transaction in the gateway: this handle is aborted too."""
        check_cell(table, row, column)
        self._check_active()
        self.flush()
        request = pb.GetRequest(
            txn_id=self.id, table=table, row=row, column=column, for_update=True
        )
        try:
            got = self._call(self._m._stub.Get, request)
        except TransactionAbortedError:
            self._pending.clear()
            self.status = TransactionStatus.ABORTED
            raise
        return got.value if got.found else None

    def get_many(
        self, table: str, cells: Iterable[tuple[bytes, bytes]]
    ) -> dict[tuple[bytes, bytes], bytes]:
        wanted = [pb.Cell(row=c.row, column=c.column) for c in check_cells(table, cells)]
        self._check_active()
        self.flush()
        got = self._call(
            self._m._stub.GetMany, pb.GetManyRequest(txn_id=self.id, table=table, cells=wanted)
        )
        return {(c.row, c.column): c.value for c in got.cells}

    def get_many_of_tables(
        self, reads: Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]
    ) -> list[dict[tuple[bytes, bytes], bytes]]:
        """One ``GetMany`` per table: the gateway's protocol reads one table a call (a
        lakehouse commit runs inside the gateway, on an embedded transaction)."""
        return [self.get_many(table, cells) for table, cells in check_reads(reads)]

    def scan(
        self, table: str, start_row: bytes = b"", end_row: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes, bytes]]:
        check_scan(table, start_row, end_row)
        self._check_active()
        self.flush()
        request = pb.ScanRequest(txn_id=self.id, table=table, start_row=start_row)
        if end_row is not None:
            request.end_row = end_row
        return self._scan(request)

    def _scan(self, request: pb.ScanRequest) -> Iterator[tuple[bytes, bytes, bytes]]:
        try:
            yield from self._scan_batches(request)
        except TransactionNotFoundError as exc:
            self.status = TransactionStatus.ABORTED
            raise TransactionAbortedError(
                f"transaction {self.id} is lost: the gateway that answered does not hold it: {exc}"
            ) from exc

    def _scan_batches(self, request: pb.ScanRequest) -> Iterator[tuple[bytes, bytes, bytes]]:
        """The scan's cells, over as many ``Scan`` calls as its consumer's pace needs.

        A call's deadline (``timeout_s``) covers the whole stream, including the time
        the caller spends between rows: a caller that works on each row would see its
        scan die with "Deadline Exceeded" after ``timeout_s`` although the gateway
        answered at once. So when the deadline ends a call that delivered cells, the scan
        goes on in a new call at the same snapshot from the last cell handed over (cells
        up to it skipped). A call that delivered no new cell in its deadline is a
        gateway that does not answer: that error is raised. SERIALIZABLE validation covers each
        call as far as it was consumed; the calls overlap at the resumed row only, and
        validating a cell twice is safe."""
        last: tuple[bytes, bytes] | None = None
        while True:
            delivered = False
            calls = self._scan_call(request)
            try:
                for cell in calls:
                    if last is not None and (cell[0], cell[1]) <= last:
                        continue  # handed over by an earlier call
                    delivered = True
                    last = cell[0], cell[1]
                    yield cell
                return
            except ServiceUnavailableError as exc:
                if exc.code is not grpc.StatusCode.DEADLINE_EXCEEDED or not delivered:
                    raise
                assert last is not None  # set with ``delivered``
                log.info(
                    "scan of %r in transaction %s outlived its %.1f s call deadline at row "
                    "%r: going on in a new call",
                    request.table,
                    self.id,
                    self._m.timeout_s,
                    last[0],
                )
                self.flush()  # writes made during the scan, as a new scan would see them
                resumed = pb.ScanRequest()
                resumed.CopyFrom(request)
                resumed.start_row = last[0]
                request = resumed
            finally:
                calls.close()  # cancels the call when the caller drops the scan

    def _scan_call(self, request: pb.ScanRequest) -> Generator[tuple[bytes, bytes, bytes]]:
        """One ``Scan`` call's cells, each recorded as read before it is handed over."""
        progress: pb.ScanProgress | None = None
        for batch in stream(self._m._stub.Scan, request, self._m._conn, self._m.timeout_s):
            if progress is None:
                progress = self._scans.setdefault(
                    batch.scan_id, pb.ScanProgress(scan_id=batch.scan_id)
                )
            for cell in batch.cells:
                # Report a row as read before handing it over: the caller may stop
                # after it (``next(iter(tx.scan(...)))``), and a SERIALIZABLE commit
                # validates the scan exactly as far as this bound says.
                progress.last.row, progress.last.column = cell.row, cell.column
                yield cell.row, cell.column, cell.value
        if progress is not None:
            progress.exhausted = True

    # --- writes --------------------------------------------------------------------

    def put(self, table: str, row: bytes, column: bytes, value: bytes) -> None:
        check_put(table, row, column, value)
        self._check_active()
        self._pending.append(pb.Mutation(table=table, row=row, column=column, put=value))
        if len(self._pending) >= WRITE_BATCH and not self.attached:
            self.flush()

    def delete(self, table: str, row: bytes, column: bytes) -> None:
        check_cell(table, row, column)
        self._check_active()
        self._pending.append(pb.Mutation(table=table, row=row, column=column, delete=True))
        if len(self._pending) >= WRITE_BATCH and not self.attached:
            self.flush()

    # --- ending --------------------------------------------------------------------

    def commit(self) -> int:
        self._check_active()
        if self._secret is None:
            raise NotTransactionOwnerError(
                f"transaction {self.id} was attached; only the process that began it commits"
            )
        try:
            self.flush()
        except TransactionError:
            self.status = TransactionStatus.ABORTED
            raise
        self.status = TransactionStatus.COMMITTING
        request = pb.CommitRequest(
            txn_id=self.id, commit_secret=self._secret, scans=list(self._scans.values())
        )
        try:
            got = self._call(self._m._stub.Commit, request)
        except TransactionAbortedError:
            self.status = TransactionStatus.ABORTED
            raise
        except CommitUnknownError:
            self.status = TransactionStatus.UNKNOWN
            raise
        except (ServiceUnavailableError, RpcError) as exc:
            return self._settle(exc)
        self.status = TransactionStatus.COMMITTED
        self.commit_ts = got.commit_ts
        return got.commit_ts

    def _settle(self, first: Exception) -> int:
        """The Commit reply was lost: ask any gateway what the transactions table says.

        The request names a sample of the cells this handle wrote (a commit whose entry
        garbage collection collected is found by its stamps there), or says it wrote
        nothing (a read-only commit needs no entry; settling writes none).
        """
        log.warning("commit of %s lost its reply (%s); settling it", self.id, first)
        last: Exception = first
        config = self._m.config
        pause_s = config.gateway_settle_pause_ms / 1000
        request = pb.StatusRequest(
            txn_id=self.id,
            settle=True,
            read_only=not self._wrote,
            written=[pb.WrittenCell(table=t, row=r, column=c) for t, r, c in self._written],
        )
        for _ in range(config.gateway_settle_attempts):
            try:
                got = self._m._call(self._m._stub.Status, request)
            except (ServiceUnavailableError, RpcError) as exc:
                last = exc
                time.sleep(pause_s)
                continue
            if got.state == pb.TRANSACTION_STATE_COMMITTED:
                self.status = TransactionStatus.COMMITTED
                self.commit_ts = got.commit_ts
                return got.commit_ts
            if got.state == pb.TRANSACTION_STATE_ABORTED:
                self.status = TransactionStatus.ABORTED
                raise TransactionAbortedError(f"transaction {self.id} did not commit") from first
            if got.forgotten:
                self.status = TransactionStatus.UNKNOWN
                raise OutcomeForgottenError(got.detail, start_ts=self.start_ts) from first
            # Settling fences, so a gateway answers COMMITTED or ABORTED once it could
            # reach the store; anything else (a gateway from before fencing) is asked again.
            time.sleep(pause_s)
        self.status = TransactionStatus.UNKNOWN
        raise CommitUnknownError(
            f"commit of {self.id} has an unknown outcome: {last}", start_ts=self.start_ts
        ) from last

    def abort(self) -> None:
        self._check_active()
        if self._secret is None:
            raise NotTransactionOwnerError(
                f"transaction {self.id} was attached; only the process that began it aborts it"
            )
        self._pending.clear()
        self.status = TransactionStatus.ABORTED
        try:
            self._m._call(
                self._m._stub.Abort, pb.AbortRequest(txn_id=self.id, commit_secret=self._secret)
            )
        except TransactionError as exc:
            # Nothing was committed; the gateway reaps it as idle if it never heard.
            log.debug("abort of %s not confirmed: %s", self.id, exc)

    def detach(self) -> None:
        """Attached handles: send what is buffered and stop using the transaction."""
        self._check_active()
        self.flush()
        self.status = TransactionStatus.ABORTED if self._secret is None else self.status

    def __enter__(self) -> RemoteTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.status is not TransactionStatus.ACTIVE:
            return
        if self.attached:
            if exc_type is None:
                self.detach()  # a failed task sends nothing: no partial effect
            else:
                self._pending.clear()
                self.status = TransactionStatus.ABORTED
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class RemoteTransactionManager:
    """The same interface as :class:`txn.TransactionManager`, through a gateway."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: TlsConfig | None = None,
        timeout_s: float = 60.0,
        config: TransactionConfig | None = None,
    ) -> None:
        self._conn = Connection(address, token=token, tls=tls)
        #: The client side of the protocol's tuning (settling lost commit replies);
        #: the rest of TransactionConfig applies inside the gateway.
        self.config = config or TransactionConfig()
        self._stub = pb_grpc.TransactionServiceStub(self._conn.channel)
        self.timeout_s = timeout_s
        self._closed = False
        # Attached handles, so that close() can tell whose buffered writes it drops.
        self._attached: weakref.WeakSet[RemoteTransaction] = weakref.WeakSet()

    @property
    def address(self) -> str:
        return self._conn.address

    @property
    def connection(self) -> Connection:
        """The channel and credentials, for the gateway's other services (the lakehouse)."""
        return self._conn

    def _call(self, fn: Callable[..., T], request: object) -> T:
        if self._closed:
            raise TransactionError("transaction manager is closed")
        return call(fn, request, self._conn, self.timeout_s)

    def begin(
        self, isolation: Isolation = Isolation.SNAPSHOT, *, pessimistic: bool = False
    ) -> RemoteTransaction:
        """A new transaction; ``pessimistic``: its ``get`` locks (``get_for_update``)."""
        check_isolation(isolation)
        if not isinstance(pessimistic, bool):
            raise TypeError(f"pessimistic must be a bool, got {pessimistic!r}")
        got = self._call(self._stub.Begin, pb.BeginRequest(isolation=isolation_to_pb(isolation)))
        return RemoteTransaction(
            self, got.txn_id, got.start_ts, isolation, got.commit_secret, pessimistic=pessimistic
        )

    def attach(self, txn_id: str) -> RemoteTransaction:
        """Join an open transaction that another process began (a Spark executor)."""
        check_txn_id(txn_id)
        got = self._call(self._stub.Attach, pb.AttachRequest(txn_id=txn_id))
        handle = RemoteTransaction(
            self, txn_id, got.start_ts, isolation_from_pb(got.isolation), None
        )
        self._attached.add(handle)
        return handle

    def run(
        self,
        fn: Callable[[RemoteTransaction], T],
        isolation: Isolation = Isolation.SNAPSHOT,
        max_attempts: int = 10,
        *,
        pessimistic: bool = False,
    ) -> T:
        """``txn.Manager.run``; ``pessimistic``: each attempt's ``get`` locks the cell."""
        if not isinstance(pessimistic, bool):
            raise TypeError(f"pessimistic must be a bool, got {pessimistic!r}")
        policy = RetryPolicy(max_attempts=max_attempts)

        def begin(isolation: Isolation) -> RemoteTransaction:
            return self.begin(isolation, pessimistic=pessimistic)

        return run_transaction(begin, self.outcome, fn, policy, isolation=isolation)[0]

    def outcome(self, txn_id: str, *, settle: bool = False) -> TransactionStatus | None:
        """``COMMITTED`` or ``ABORTED`` once decided; ``None`` while undecided.

        With ``settle`` the answer is final (rule S6): a transaction still open on
        the gateway is aborted there first, so a Commit of it that is still on its
        way can no longer land. A transaction whose entry garbage collection may have
        collected is never settled as aborted: :class:`~txn.errors.OutcomeForgottenError`
        (a ``CommitUnknownError``) says its outcome is no longer known.
        """
        check_txn_id(txn_id)
        got = self._call(self._stub.Status, pb.StatusRequest(txn_id=txn_id, settle=settle))
        if got.forgotten:
            raise OutcomeForgottenError(got.detail, start_ts=got.start_ts)
        state = state_from_pb(got.state) if got.state != pb.TRANSACTION_STATE_UNSPECIFIED else None
        if state in (TransactionStatus.COMMITTED, TransactionStatus.ABORTED):
            return state
        return None

    def close(self) -> None:
        """Close the channel. Raises if attached handles still held unsent writes.

        Those writes are dropped (the gateway never saw them), which is right for a
        task that failed, but a task that meant them to count must ``detach()`` or
        leave its ``with`` block first: silence here would lose data unnoticed.
        """
        dropped = self._drop_attached()
        if dropped:
            raise TransactionError(
                f"transaction manager closed with unsent writes of attached transactions: "
                f"{dropped}; nothing of them reached the gateway (call detach() or leave the "
                "handle's with-block before closing)"
            )

    def _drop_attached(self) -> str:
        if self._closed:
            return ""
        self._closed = True
        lost = [
            f"{len(h._pending)} writes of {h.id}"
            for h in list(self._attached)
            if h.status is TransactionStatus.ACTIVE and h._pending
        ]
        for handle in list(self._attached):
            handle._pending.clear()
            handle.status = TransactionStatus.ABORTED
        self._conn.close()
        return ", ".join(lost)

    def __enter__(self) -> RemoteTransactionManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # Already failing: dropping the writes of a failed task is intended; say so
        # without hiding the error in flight.
        dropped = self._drop_attached()
        if dropped:
            log.warning("closing after %s: dropped unsent %s", exc_type.__name__, dropped)
