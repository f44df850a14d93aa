"""The transaction gateway: ``TransactionService`` over an embedded-style manager.

Open transactions live in this process, keyed by id. Calls on one transaction are
serialised (a transaction belongs to one thread), so executors that attached to it
may call concurrently. Only the caller holding the commit secret handed out by
Begin may commit. Idle transactions are aborted after a timeout.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from storage_adapters import Cell
from txn._args import check_cell, check_put
from txn._isolation import TransactionStatus
from txn._manager import TransactionManager
from txn._status import ABORTED, mark_attached, was_attached
from txn._transaction import EmbeddedTransaction
from txn.errors import (
    NotTransactionOwnerError,
    OutcomeForgottenError,
    TransactionAbortedError,
    TransactionClosedError,
    TransactionLimitError,
    TransactionNotFoundError,
)
from txn.lowering import isolation_from_pb, isolation_to_pb, state_to_pb
from wire import metrics
from wire.error_codes import GatewayDrainingError, abort_with
from wire.v1 import transaction_pb2 as pb
from wire.v1 import transaction_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: Finished transactions remembered for Status and for a clear "closed" error.
_FINISHED_REMEMBERED = 100_000


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """Limits of one gateway. Units in the names."""

    max_buffered_writes: int = 1_000_000
    max_open_transactions: int = 10_000
    idle_timeout_s: float = 300.0
    scan_batch_size: int = 1_000
    max_scan_batch_size: int = 10_000

    def __post_init__(self) -> None:
        for name in (
            "max_buffered_writes",
            "max_open_transactions",
            "scan_batch_size",
            "max_scan_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be positive")


@dataclass(slots=True)
class _Open:
    tx: EmbeddedTransaction
    secret: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    #: Recorded in the store as holding writes of attached handles (see Write).
    attached: bool = False


class TransactionServicer(pb_grpc.TransactionServiceServicer):
    def __init__(self, manager: TransactionManager, limits: GatewayLimits | None = None) -> None:
        self._tm = manager
        self._limits = limits or GatewayLimits()
        self._open: dict[str, _Open] = {}
        self._finished: OrderedDict[str, tuple[TransactionStatus, int | None]] = OrderedDict()
        #: The finished ones the reaper aborted as idle (a subset of ``_finished``).
        self._reaped: set[str] = set()
        self._registry = threading.Lock()
        self._stop = threading.Event()
        #: Why Begin is refused (the gateway is draining), or None while it admits.
        self._draining: str | None = None
        self._reaper = threading.Thread(target=self._reap, name="percolake-reaper", daemon=True)
        self._reaper.start()
        metrics.track_open_transactions(self.open_transactions)

    def open_transactions(self) -> int:
        """How many transactions are open on this gateway now."""
        return len(self._open)

    # --- bookkeeping ---------------------------------------------------------------

    def _entry(self, txn_id: str) -> _Open:
        with self._registry:
            entry = self._open.get(txn_id)
            if entry is not None:
                entry.last_used = time.monotonic()
                return entry
            if txn_id in self._reaped:
                raise self._aborted_as_idle(txn_id)
            if txn_id in self._finished:
                status, _ = self._finished[txn_id]
                raise TransactionClosedError(f"transaction {txn_id} is {status.value}")
        raise TransactionNotFoundError(
            f"no open transaction {txn_id!r} on this gateway (never begun, or aborted as idle)"
        )

    def _finish(self, txn_id: str, entry: _Open, *, idle: bool = False) -> None:
        with self._registry:
            self._open.pop(txn_id, None)
            self._finished[txn_id] = (entry.tx.status, entry.tx.commit_ts)
            if idle:
                self._reaped.add(txn_id)
            while len(self._finished) > _FINISHED_REMEMBERED:
                forgotten, _ = self._finished.popitem(last=False)
                self._reaped.discard(forgotten)

    def _finish_if_ended(self, txn_id: str, entry: _Open) -> None:
        """Finish a transaction that a call aborted on its own (``get_for_update``'s
        lock-wait timeout or deadlock): it no longer counts as open. The caller holds
        ``entry.lock``."""
        if entry.tx.status is TransactionStatus.ABORTED:
            self._finish(txn_id, entry)

    def _aborted_as_idle(self, txn_id: str) -> TransactionAbortedError:
        # Aborted, not "closed": its client's next call (a Write flushed by commit, or
        # the Commit) must learn that nothing of it committed, and why.
        return TransactionAbortedError(
            f"transaction {txn_id} was aborted by the gateway: idle for over "
            f"{self._limits.idle_timeout_s:g} s (--idle-timeout-s) without a call; "
            "nothing of it was committed, begin a new one"
        )

    def _reap(self) -> None:
        period = min(self._limits.idle_timeout_s / 4, 5.0)
        while not self._stop.wait(period):
            deadline = time.monotonic() - self._limits.idle_timeout_s
            with self._registry:
                idle = [(i, e) for i, e in self._open.items() if e.last_used < deadline]
            for txn_id, entry in idle:
                if not entry.lock.acquire(blocking=False):
                    continue  # in use right now: not idle
                try:
                    reaped = entry.tx.status is TransactionStatus.ACTIVE
                    if reaped:
                        entry.tx.abort(reason="idle")
                        log.info(
                            "aborted transaction %s: idle for over %.0f s",
                            txn_id,
                            self._limits.idle_timeout_s,
                        )
                    self._finish(txn_id, entry, idle=reaped)
                finally:
                    entry.lock.release()

    def _commit_entry(self, txn_id: str) -> _Open:
        """The open transaction a Commit is for. One aborted before its Commit ran
        (settled by another client, reaped as idle) answers "definitely not
        committed", one of the three outcomes a commit has, not "closed"."""
        try:
            return self._entry(txn_id)
        except TransactionClosedError:
            with self._registry:
                finished = self._finished.get(txn_id)
            if finished is not None and finished[0] is TransactionStatus.ABORTED:
                raise _aborted_before_commit(txn_id) from None
            raise

    def _fence(
        self, txn_id: str, entry: _Open, *, read_only: bool = False
    ) -> tuple[TransactionStatus, int | None]:
        """Decide an open transaction for good: settling must fence (rule S6).

        Waits for a commit in progress to end; a transaction still ACTIVE is
        aborted, so a Commit request of it that has not run yet (queued behind a
        Write, or waiting for a worker thread) finds it closed and cannot land.
        ``read_only``: its owner wrote nothing; if nobody else did either, it is
        committed instead (a read-only commit needs no entry and never aborts).
        """
        with entry.lock:
            if entry.tx.status is TransactionStatus.ACTIVE:
                if read_only and entry.tx.buffered_writes == 0:
                    entry.tx.commit()
                    log.info("committed read-only transaction %s to settle it", txn_id)
                else:
                    entry.tx.abort(reason="fenced")
                    log.info("aborted open transaction %s to settle its outcome", txn_id)
            if entry.tx.status is not TransactionStatus.COMMITTING:
                self._finish(txn_id, entry)
            return entry.tx.status, entry.tx.commit_ts

    def drain(self, why: str) -> None:
        """Admit no new transaction: Begin answers :class:`GatewayDrainingError` (the
        client begins on another replica); open transactions go on to their end."""
        with self._registry:
            self._draining = why

    def shutdown(self) -> None:
        """Abort every transaction that is not committing; called after the server drained."""
        self._stop.set()
        with self._registry:
            entries = list(self._open.items())
        for txn_id, entry in entries:
            with entry.lock:
                if entry.tx.status is TransactionStatus.ACTIVE:
                    entry.tx.abort(reason="shutdown")
                self._finish(txn_id, entry)
        if entries:
            log.info("aborted %d open transactions at shutdown", len(entries))

    # --- the service ---------------------------------------------------------------

    def Begin(self, request: pb.BeginRequest, context: grpc.ServicerContext) -> pb.BeginResponse:
        try:
            isolation = isolation_from_pb(request.isolation)
            with self._registry:
                if self._draining is not None:
                    raise GatewayDrainingError(self._draining)
                if len(self._open) >= self._limits.max_open_transactions:
                    raise TransactionLimitError(
                        f"too many open transactions (limit {self._limits.max_open_transactions})"
                    )
            tx = self._tm.begin(isolation)
            entry = _Open(tx, secrets.token_hex(16))
            with self._registry:
                draining = self._draining
                if draining is None:
                    self._open[tx.id] = entry
            if draining is not None:  # the drain began while this one took its timestamp
                tx.abort(reason="shutdown")
                raise GatewayDrainingError(draining)
        except Exception as exc:
            abort_with(context, exc)
        return pb.BeginResponse(
            txn_id=tx.id,
            start_ts=tx.start_ts,
            isolation=isolation_to_pb(isolation),
            commit_secret=entry.secret,
        )

    def Get(self, request: pb.GetRequest, context: grpc.ServicerContext) -> pb.GetResponse:
        try:
            entry = self._entry(request.txn_id)
            with entry.lock:
                read = entry.tx.get_for_update if request.for_update else entry.tx.get
                try:
                    value = read(request.table, request.row, request.column)
                finally:
                    # A lock-wait timeout or a deadlock aborted it: it is finished here.
                    self._finish_if_ended(request.txn_id, entry)
        except Exception as exc:
            abort_with(context, exc)
        if value is None:
            return pb.GetResponse(found=False)
        return pb.GetResponse(found=True, value=value)

    def GetMany(
        self, request: pb.GetManyRequest, context: grpc.ServicerContext
    ) -> pb.GetManyResponse:
        try:
            entry = self._entry(request.txn_id)
            with entry.lock:
                found = entry.tx.get_many(request.table, [(c.row, c.column) for c in request.cells])
        except Exception as exc:
            abort_with(context, exc)
        return pb.GetManyResponse(
            cells=[pb.CellValue(row=r, column=c, value=v) for (r, c), v in found.items()]
        )

    def Scan(
        self, request: pb.ScanRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ScanResponse]:
        try:
            batch = request.batch_size or self._limits.scan_batch_size
            if batch > self._limits.max_scan_batch_size:
                raise ValueError(
                    f"batch_size must be at most {self._limits.max_scan_batch_size}, got {batch}"
                )
            entry = self._entry(request.txn_id)
            end = request.end_row if request.HasField("end_row") else None
            with entry.lock:
                scan_id = entry.tx.scans_started
                rows = entry.tx.scan(request.table, request.start_row, end)
            while True:
                with entry.lock:
                    cells = [
                        pb.CellValue(row=r, column=c, value=v)
                        for r, c, v in itertools.islice(rows, batch)
                    ]
                    entry.last_used = time.monotonic()
                if not cells:
                    return
                yield pb.ScanResponse(cells=cells, scan_id=scan_id)
                if len(cells) < batch:
                    return
        except Exception as exc:
            abort_with(context, exc)

    def Write(self, request: pb.WriteRequest, context: grpc.ServicerContext) -> pb.WriteResponse:
        try:
            for m in request.mutations:  # all or nothing: validate before buffering any
                kind = m.WhichOneof("kind")
                if kind is None:
                    raise ValueError("a mutation needs put or delete")
                if kind == "put":
                    check_put(m.table, m.row, m.column, m.put)  # the store's limits too
                else:
                    check_cell(m.table, m.row, m.column)
            entry = self._entry(request.txn_id)
            with entry.lock:
                if request.attached and request.mutations and not entry.attached:
                    # Durable before the writes are buffered: once the owner's Commit
                    # reply is lost and this gateway is gone, settling must know the
                    # transaction holds writes its owner did not make (see Status).
                    mark_attached(self._tm.store, entry.tx.start_ts)
                    entry.attached = True
                buffered = entry.tx.buffered_writes
                if buffered + len(request.mutations) > self._limits.max_buffered_writes:
                    raise TransactionLimitError(
                        f"transaction would buffer more than "
                        f"{self._limits.max_buffered_writes} writes"
                    )
                try:
                    for m in request.mutations:
                        if m.WhichOneof("kind") == "put":
                            entry.tx.put(m.table, m.row, m.column, m.put)
                        else:
                            entry.tx.delete(m.table, m.row, m.column)
                finally:
                    # A write to a locked cell that a later writer committed aborts it.
                    self._finish_if_ended(request.txn_id, entry)
                buffered = entry.tx.buffered_writes
        except Exception as exc:
            abort_with(context, exc)
        return pb.WriteResponse(buffered=buffered)

    def Commit(self, request: pb.CommitRequest, context: grpc.ServicerContext) -> pb.CommitResponse:
        try:
            entry = self._commit_entry(request.txn_id)
            _check_owner(entry, request.commit_secret, request.txn_id, "commit")
            with entry.lock:
                if entry.tx.status is TransactionStatus.ABORTED:  # fenced while queued
                    if request.txn_id in self._reaped:
                        raise self._aborted_as_idle(request.txn_id)
                    raise _aborted_before_commit(request.txn_id)
                for progress in request.scans:
                    last = progress.last if progress.HasField("last") else None
                    entry.tx.limit_scan(
                        progress.scan_id,
                        None if last is None else Cell(last.row, last.column),
                        progress.exhausted,
                    )
                try:
                    commit_ts = entry.tx.commit()
                finally:
                    if entry.tx.status is not TransactionStatus.ACTIVE:
                        self._finish(request.txn_id, entry)
        except Exception as exc:
            abort_with(context, exc)
        return pb.CommitResponse(commit_ts=commit_ts)

    def Abort(self, request: pb.AbortRequest, context: grpc.ServicerContext) -> pb.AbortResponse:
        try:
            entry = self._entry(request.txn_id)
            _check_owner(entry, request.commit_secret, request.txn_id, "abort")
            with entry.lock:
                entry.tx.abort()
                self._finish(request.txn_id, entry)
        except Exception as exc:
            abort_with(context, exc)
        return pb.AbortResponse()

    def Attach(self, request: pb.AttachRequest, context: grpc.ServicerContext) -> pb.AttachResponse:
        try:
            entry = self._entry(request.txn_id)
            if entry.tx.status is not TransactionStatus.ACTIVE:
                raise TransactionClosedError(f"transaction {request.txn_id} is not active")
        except Exception as exc:
            abort_with(context, exc)
        return pb.AttachResponse(
            start_ts=entry.tx.start_ts, isolation=isolation_to_pb(entry.tx.isolation)
        )

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:
        start_ts = 0
        try:
            start_ts = _start_ts_of(request.txn_id)
            written = _written_cells(request)
            read_only = request.settle and request.read_only
            with self._registry:
                entry = self._open.get(request.txn_id)
                finished = self._finished.get(request.txn_id)
            if entry is not None:
                if not request.settle:
                    tx = entry.tx
                    return pb.StatusResponse(
                        state=state_to_pb(tx.status),
                        start_ts=tx.start_ts,
                        commit_ts=tx.commit_ts or 0,
                    )
                finished = self._fence(request.txn_id, entry, read_only=read_only)
            if finished is not None and finished[0] is not TransactionStatus.UNKNOWN:
                status, commit_ts = finished
                return pb.StatusResponse(
                    state=state_to_pb(status), start_ts=start_ts, commit_ts=commit_ts or 0
                )
            # Not open here: the transactions table is the truth, on any gateway.
            if read_only and not was_attached(self._tm.store, start_ts):
                # Its owner wrote nothing and nobody attached: a read-only commit
                # needs no entry, and settling writes none.
                found = self._tm.outcome_of(start_ts)
                return _committed(start_ts, start_ts if found in (None, ABORTED) else found)
            outcome = self._tm.outcome_of(start_ts, settle=request.settle, written=written)
        except OutcomeForgottenError as exc:
            return pb.StatusResponse(
                state=pb.TRANSACTION_STATE_UNKNOWN,
                start_ts=start_ts,
                forgotten=True,
                detail=str(exc),
            )
        except Exception as exc:
            abort_with(context, exc)
        if outcome is None:
            return pb.StatusResponse(state=pb.TRANSACTION_STATE_UNSPECIFIED, start_ts=start_ts)
        if outcome == ABORTED:
            return pb.StatusResponse(state=pb.TRANSACTION_STATE_ABORTED, start_ts=start_ts)
        return _committed(start_ts, outcome)


#: Cells a Status request may name (a sample of the write set is enough).
MAX_WRITTEN_CELLS = 1_000


def _written_cells(request: pb.StatusRequest) -> list[tuple[str, Cell]]:
    if len(request.written) > MAX_WRITTEN_CELLS:
        raise ValueError(
            f"a Status request names at most {MAX_WRITTEN_CELLS} written cells, "
            f"got {len(request.written)}"
        )
    for c in request.written:
        check_cell(c.table, c.row, c.column)
    return [(c.table, Cell(c.row, c.column)) for c in request.written]


def _committed(start_ts: int, commit_ts: int) -> pb.StatusResponse:
    return pb.StatusResponse(
        state=pb.TRANSACTION_STATE_COMMITTED, start_ts=start_ts, commit_ts=commit_ts
    )


def _aborted_before_commit(txn_id: str) -> TransactionAbortedError:
    return TransactionAbortedError(
        f"transaction {txn_id} was aborted before its commit ran (settled by another "
        "client, or idle too long); nothing of it was committed"
    )


def _check_owner(entry: _Open, secret: str, txn_id: str, what: str) -> None:
    if not hmac.compare_digest(secret.encode(), entry.secret.encode()):
        raise NotTransactionOwnerError(
            f"only the client that began transaction {txn_id} may {what} it"
        )


def _start_ts_of(txn_id: str) -> int:
    if not txn_id.isdigit():
        raise TransactionNotFoundError(f"{txn_id!r} is not a transaction id")
    return int(txn_id)
