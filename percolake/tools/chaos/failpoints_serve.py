"""Test-only fail points inside a gateway, steered in band by the test's own clients.

A state machine that drives a real gateway process needs to make a few things
happen at the gateway that timing alone makes rare: a Commit request that waits
at the gateway while other calls go by, a Commit whose reply is lost after (or
instead of) running, and a Scan stream whose next batch is computed only after
the client did something between two pulls (an unpaced gateway reads a small
scan to its end before the client has pulled its first row).

The switch is the environment variable ``PERCOLAKE_TEST_SERVE_FAILPOINTS=1`` and
nothing else; only ``python -m percolake.tools.chaos.serve`` reads it
(:func:`serve_failpoints_requested`) and then builds its gateway from
:class:`SteeredTransactionServicer`, never the installed ``percolake serve``.

In such a gateway, a client steers the fail points of one transaction by buffering
writes to :data:`CONTROL_TABLE` in it: the gateway takes those writes out of every
Write request before the transaction sees them, so they are never buffered,
validated or committed. The row names the fail point, the value is its argument:

====================  ==================================================================
``commit.delay_ms``   the Commit of this transaction waits this long at the gateway
                      before it is handled (it is queued: other calls go by meanwhile)
``commit.reply``      ``lose``: the Commit runs, its reply is replaced by UNAVAILABLE;
                      ``drop``: the Commit does not run, the reply is UNAVAILABLE
``scan.batch_size``   scans of this transaction stream this many cells per batch
                      unless the request names a size
``scan.lockstep``     ``1``: after each full batch, the next batch of a scan is computed
                      only once the client sent one ``scan.next`` (needs a batch size)
``scan.next``         one permission for one more batch of the transaction's newest scan
``status.late``       ``1``: the next ``Status(settle=True)`` of this transaction comes
                      late: the gateway first runs a ``gc.pass`` and forgets the
                      transaction (``status.forget``), as if the settle reached another
                      gateway after a garbage-collection pass
====================  ==================================================================

Two controls act on the whole gateway, whatever transaction carries them (a test sends
them in a throwaway transaction of its own):

====================  ==================================================================
``gc.pass``           the Write returns after one garbage-collection pass ran on the
                      gateway's store (:class:`~txn.GarbageCollector`, retention 0, grace
                      0, the gateway's oracle and locks). Its safe point stays at or below
                      the oldest transaction open on this gateway (published as a manager
                      registration: a long-running transaction's), so the test's open
                      transactions keep their snapshots; everything that committed before
                      them may lose its transactions-table entry (rule S9). Afterwards the
                      gateway's readers forget every outcome they cached, as readers in
                      another process would know none
``status.forget``     value: a transaction id. The gateway forgets what it remembers of
                      that finished transaction (the outcome its ``Status`` answers from
                      memory) and every cached outcome, as a restarted gateway or another
                      replica would: its next ``Status`` reads the store (an open
                      transaction is never forgotten)
``locks.failover``    the gateway's transactions move to a fresh lock table, as after a
                      lock-server restart or failover: every lock is lost, the
                      ``get_for_update`` locks of open transactions among them
``locks.expire``      the clock of that table jumps past every lease, as if each holder
                      paused longer than its lease: every grant expires
====================  ==================================================================

The lock controls act on a table of the test build's own, over a clock it can move: the
first lock control of a gateway process moves its transactions to one (so the first
``locks.expire`` also loses every lock, as a failover does; the table the process serves
as its lock role is left alone).

The first ``gc.pass`` of a gateway process waits the default grace once (5 s): readers
may hold a lease on the safe point from before the first pass wrote grace 0.

Deliberately broken builds for the tests that show the checks can fail: with
``PERCOLAKE_UNSAFE_BROKEN_SETTLE`` set as well, the gateway settles as it did before
issue 30 (:func:`steered_gateway_class`). ``safe-point``
(:class:`SettleIgnoresSafePointServicer`): ``Status(settle=True)`` of a transaction it
does not hold writes ABORTED whenever it finds no transactions-table entry, whether or
not garbage collection may have collected it (item 1). ``read-only``
(:class:`SettleIgnoresReadOnlyServicer`): the same, and it also ignores that the owner
wrote nothing, so a read-only commit whose reply was lost is settled ABORTED (item 4).

The same switch builds the gateway's ``LakehouseService`` from
:class:`SteeredLakehouseServicer`, whose group committer (:class:`SteeredGroupCommitter`)
obeys a control file. Lakehouse requests carry no table a test could write steering
to, so the file is named out of band, by ``PERCOLAKE_TEST_LAKEHOUSE_CONTROL=<path>`` in
the gateway's environment (unset: the committer only counts). The gateway reads the
file at every group, so a test changes the steering by rewriting it (atomically: write
a temporary file and rename it). It holds one JSON object:

``hold_first_group_until``  an int K: the first group this gateway commits is formed
                            only once K commit requests of its table are queued, so
                            they commit together (K members, up to the group bound:
                            deterministic group commit; waits at most
                            :data:`HOLD_MAX_WAIT_S`)
``rules``                   a list of ``{"id", "at", "min_size", "action"}``: each fires once
                            per gateway process, at the first group of at least
                            ``min_size`` (default 1) requests that reaches ``at``:
                            ``before`` (the group's transaction has not begun) or
                            ``after`` (it committed, no member was answered yet)

A rule's ``action`` is ``block`` (the group waits there until the rule is gone from the
file, at most :data:`BLOCK_MAX_WAIT_S`: a test kills the gateway meanwhile) or
``unknown`` (every member of the group is answered ``commit-unknown``: after the commit
point that is a reply lost after the commit, before it one lost with nothing done).
When a rule fires, the gateway writes ``<control file>.<id>.fired``, a JSON object with
its ``pid`` and the group's ``job_ids``, before it acts (renamed into place, so a test
that sees the file can read it whole).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from lockserver import LockTable
from percolake.tools.chaos._config import TEST_GC_GRACE_ENV
from spark_integration.engine import Catalog, CommitRequest
from spark_integration.service import GroupCommitter, LakehouseLimits, LakehouseServicer
from spark_integration.service.group_commit import TableQueue
from txn import GarbageCollector, GcLoop, GcReport, Registration, TransactionStatus
from txn.gateway import TransactionServicer
from txn.lowering import state_to_pb
from txn.tables import ABORTED
from wire.error_codes import abort_with
from wire.errors import CommitUnknownError
from wire.v1 import transaction_pb2 as pb

log = logging.getLogger(__name__)

#: Environment variable that switches the fail points on (exactly ``"1"``).
SERVE_FAILPOINTS_ENV: Final = "PERCOLAKE_TEST_SERVE_FAILPOINTS"
#: Writes to this table steer fail points; they never reach a transaction.
CONTROL_TABLE: Final = "__percolake_failpoint__"
#: Control rows (fail point names), see the module docstring.
COMMIT_DELAY_MS: Final = b"commit.delay_ms"
COMMIT_REPLY: Final = b"commit.reply"
SCAN_BATCH_SIZE: Final = b"scan.batch_size"
SCAN_LOCKSTEP: Final = b"scan.lockstep"
SCAN_NEXT: Final = b"scan.next"
STATUS_LATE: Final = b"status.late"
#: Controls of the whole gateway (see the module docstring).
GC_PASS: Final = b"gc.pass"
STATUS_FORGET: Final = b"status.forget"
LOCKS_FAILOVER: Final = b"locks.failover"
LOCKS_EXPIRE: Final = b"locks.expire"
#: With the fail points on, ``safe-point`` or ``read-only`` makes the gateway a broken
#: settling build (see the module docstring).
BROKEN_SETTLE_ENV: Final = "PERCOLAKE_UNSAFE_BROKEN_SETTLE"
#: A lockstep scan whose client never sends the next permission stops waiting after
#: this long (a safety valve: the stream then goes on as an unpaced one would).
LOCKSTEP_MAX_WAIT_S: Final = 30.0
_POLL_S: Final = 0.05
#: Names the lakehouse control file (see the module docstring).
LAKEHOUSE_CONTROL_ENV: Final = "PERCOLAKE_TEST_LAKEHOUSE_CONTROL"
#: Safety valves: a held first group, or a blocked one, goes on after this long (a test
#: that forgot to release it must not leave a gateway stuck for good).
HOLD_MAX_WAIT_S: Final = 60.0
BLOCK_MAX_WAIT_S: Final = 300.0


@dataclass(slots=True)
class _Steering:
    """The fail points one transaction asked for."""

    commit_delay_ms: int = 0
    commit_reply: str = ""
    scan_batch_size: int = 0
    lockstep: bool = False
    permits: int = 0
    #: Scans started so far; a lockstep scan stops waiting once a newer one starts.
    scans: int = 0
    finished: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_txn: dict[str, _Steering] = {}

    def get(self, txn_id: str) -> _Steering | None:
        with self._lock:
            return self._by_txn.get(txn_id)

    def setdefault(self, txn_id: str) -> _Steering:
        with self._lock:
            return self._by_txn.setdefault(txn_id, _Steering())

    def finish(self, txn_id: str) -> None:
        with self._lock:
            steering = self._by_txn.pop(txn_id, None)
        if steering is not None:
            with steering.changed:
                steering.finished = True
                steering.changed.notify_all()


_registry = _Registry()


def serve_failpoints_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``PERCOLAKE_TEST_SERVE_FAILPOINTS`` is exactly ``"1"``."""
    env = os.environ if environ is None else environ
    return env.get(SERVE_FAILPOINTS_ENV) == "1"


def steered_gateway_class(
    environ: Mapping[str, str] | None = None,
) -> type[SteeredTransactionServicer]:
    """The gateway of the test build: by ``PERCOLAKE_UNSAFE_BROKEN_SETTLE``, unset or
    empty: :class:`SteeredTransactionServicer`; ``safe-point``:
    :class:`SettleIgnoresSafePointServicer`; ``read-only``:
    :class:`SettleIgnoresReadOnlyServicer`."""
    env = os.environ if environ is None else environ
    broken = env.get(BROKEN_SETTLE_ENV, "")
    builds: dict[str, type[SteeredTransactionServicer]] = {
        "": SteeredTransactionServicer,
        "safe-point": SettleIgnoresSafePointServicer,
        "read-only": SettleIgnoresReadOnlyServicer,
    }
    if broken not in builds:
        raise ValueError(f"{BROKEN_SETTLE_ENV} must be safe-point or read-only, got {broken!r}")
    return builds[broken]


class SteeredTransactionServicer(TransactionServicer):
    """TEST BUILD: the gateway with fail points steered through :data:`CONTROL_TABLE`.

    Passed explicitly as the gateway class of a test server (the ``gateway_class`` of
    its :class:`~percolake.serve.testing.TestBuild`); nothing is patched.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log.critical(
            "%s=1: this gateway obeys test fail points written to table %s; "
            "it exists only for tests",
            SERVE_FAILPOINTS_ENV,
            CONTROL_TABLE,
        )
        self._gc_lock = threading.Lock()
        self._collector: GarbageCollector | None = None
        # A registration of its own (never the manager's, whose thread may overwrite
        # it between the publication and the pass), published just before each pass.
        self._gc_registration = Registration(
            self._tm.store, self._tm._rt.active.oldest, interval_s=3600.0
        )
        self._late_lock = threading.Lock()
        self._late: set[str] = set()
        self.gc_passes = 0
        #: How far the clock of the lock table of the lock controls was moved on.
        self._lock_skew_s = 0.0
        self._steered_locks: LockTable | None = None

    def _lock_clock(self) -> float:
        return time.monotonic() + self._lock_skew_s

    # --- the whole gateway's controls ------------------------------------------------

    def gc_pass(self) -> GcReport:
        """One garbage-collection pass at retention 0, below every open transaction."""
        with self._gc_lock:
            rt = self._tm._rt
            if self._collector is None:
                self._collector = GarbageCollector(
                    rt.store,
                    timestamps=rt.timestamps,
                    locks=rt.locks,
                    retention_s=0.0,
                    grace_ms=0,
                    config=rt.config,
                )
            oldest, latest = rt.active.oldest()
            self._gc_registration.publish(oldest, latest)
            report = self._collector.run_once()
            rt.resolver.clear_cache()
            self.gc_passes += 1
        log.warning("test gc.pass %d (open from %s): %s", self.gc_passes, oldest, report.summary())
        return report

    def fail_over_locks(self) -> None:
        """Move the transactions to a fresh lock table: every lock is lost, and calls
        still waiting in the previous table of this build end as in a failed lock
        server (its term ended)."""
        with self._gc_lock:
            previous, self._steered_locks = self._steered_locks, LockTable(self._lock_clock)
            self._tm.replace_locks(self._steered_locks)
            self._collector = None  # it would ask the old table
        if previous is not None:
            previous.close()
        log.warning("test locks.failover: a fresh lock table, every lock lost")

    def expire_locks(self) -> None:
        """Every grant of the lock table outlives its lease."""
        if self._steered_locks is None:
            self.fail_over_locks()
        self._lock_skew_s += self._tm._rt.config.lease_ms / 1000 + 1.0
        log.warning("test locks.expire: the lock table's clock is %.1f s ahead", self._lock_skew_s)

    def forget(self, txn_id: str) -> None:
        """Forget a finished transaction's outcome, and every cached one."""
        with self._registry:
            if txn_id not in self._open:
                self._finished.pop(txn_id, None)
        self._tm._rt.resolver.clear_cache()

    def Write(self, request: pb.WriteRequest, context: grpc.ServicerContext) -> pb.WriteResponse:
        controls = [m for m in request.mutations if m.table == CONTROL_TABLE]
        if not controls:
            return super().Write(request, context)
        permits = 0
        for m in controls:
            if m.row == SCAN_NEXT:
                permits += 1
            elif m.row == GC_PASS:
                try:
                    self.gc_pass()
                except Exception as exc:
                    abort_with(context, exc)
            elif m.row == STATUS_FORGET:
                self.forget(m.put.decode())
            elif m.row == LOCKS_FAILOVER:
                self.fail_over_locks()
            elif m.row == LOCKS_EXPIRE:
                self.expire_locks()
            elif m.row == STATUS_LATE:
                with self._late_lock:
                    self._late.add(request.txn_id)
            else:
                _configure(_registry.setdefault(request.txn_id), m.row, m.put)
        rest = [m for m in request.mutations if m.table != CONTROL_TABLE]
        response = (
            super().Write(
                pb.WriteRequest(txn_id=request.txn_id, mutations=rest, attached=request.attached),
                context,
            )
            if rest
            else pb.WriteResponse()
        )
        if permits:  # after the other writes are buffered: the next batch must see them
            steering = _registry.setdefault(request.txn_id)
            with steering.changed:
                steering.permits += permits
                steering.changed.notify_all()
        return response

    def Commit(self, request: pb.CommitRequest, context: grpc.ServicerContext) -> pb.CommitResponse:
        steering = _registry.get(request.txn_id)
        if steering is None:
            return super().Commit(request, context)
        if steering.commit_delay_ms:
            time.sleep(steering.commit_delay_ms / 1000)
        reply = steering.commit_reply
        if reply == "drop":
            _lose_reply(context, "dropped")
        try:
            response = super().Commit(request, context)
        except Exception:
            if reply == "lose":
                _lose_reply(context, "lost after the commit failed")
            raise
        finally:
            _registry.finish(request.txn_id)
        if reply == "lose":
            _lose_reply(context, "lost after the commit ran")
        return response

    def Abort(self, request: pb.AbortRequest, context: grpc.ServicerContext) -> pb.AbortResponse:
        try:
            return super().Abort(request, context)
        finally:
            _registry.finish(request.txn_id)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:
        late = False
        if request.settle:
            with self._late_lock:
                late = request.txn_id in self._late
                self._late.discard(request.txn_id)
        if late:
            try:
                self.gc_pass()
            except Exception as exc:
                abort_with(context, exc)
            self.forget(request.txn_id)
        return self._status(request, context)

    def _status(
        self, request: pb.StatusRequest, context: grpc.ServicerContext
    ) -> pb.StatusResponse:
        return super().Status(request, context)

    def Scan(
        self, request: pb.ScanRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ScanResponse]:
        steering = _registry.get(request.txn_id)
        if steering is None:
            yield from super().Scan(request, context)
            return
        if not request.batch_size and steering.scan_batch_size:
            request.batch_size = steering.scan_batch_size
        with steering.changed:
            steering.scans += 1
            steering.permits = 0  # permits are for the newest scan only
            this_scan = steering.scans
            steering.changed.notify_all()
        paced = steering.lockstep and request.batch_size > 0
        batches = iter(super().Scan(request, context))
        batch = next(batches, None)
        while batch is not None:
            yield batch
            # A short batch was the last one: the stream ends without computing another.
            if paced and len(batch.cells) == request.batch_size:
                _await_permit(steering, this_scan, context)
            batch = next(batches, None)


class SettleIgnoresSafePointServicer(SteeredTransactionServicer):
    """TEST BUILD, BROKEN ON PURPOSE: settles writers as the gateway did before issue 30.

    ``Status(settle=True)`` of a transaction this gateway does not hold reads the
    transactions table and, finding no entry, writes ABORTED: it ignores that garbage
    collection may have collected a committed writer's entry (below the safe point, rule
    S9) and the cells the owner says it wrote. An open transaction is fenced as before,
    and an owner that wrote nothing is answered as the fixed gateway answers it (see
    :class:`SettleIgnoresReadOnlyServicer` for that). It exists only to show that the
    tests catch such a settle.
    """

    #: Whether an owner's "I wrote nothing" is ignored too (item 4 broken as well).
    ignores_read_only = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log.critical(
            "%s: this gateway settles transactions it does not hold as ABORTED whenever "
            "their entry is missing, even below the garbage-collection safe point%s; it "
            "exists only to prove that tests catch that",
            BROKEN_SETTLE_ENV,
            " (only those whose owner wrote nothing)" if self.ignores_read_only else "",
        )

    def _status(
        self, request: pb.StatusRequest, context: grpc.ServicerContext
    ) -> pb.StatusResponse:
        if not request.settle or not request.txn_id.isdigit():
            return super()._status(request, context)
        if request.read_only != self.ignores_read_only:
            # Each build breaks one thing: the safe-point build settles writers wrongly
            # and owners that wrote nothing as the fixed gateway does; the read-only
            # build the other way round, so that the machine must find that very bug.
            return super()._status(request, context)
        start_ts = int(request.txn_id)
        try:
            with self._registry:
                entry = self._open.get(request.txn_id)
                finished = self._finished.get(request.txn_id)
            if entry is not None:
                finished = self._fence(request.txn_id, entry)
            if finished is not None and finished[0] is not TransactionStatus.UNKNOWN:
                status, commit_ts = finished
                return pb.StatusResponse(
                    state=state_to_pb(status), start_ts=start_ts, commit_ts=commit_ts or 0
                )
            resolver = self._tm._rt.resolver
            outcome = resolver.read([start_ts]).get(start_ts)
            if outcome is None:
                outcome = resolver.settle_aborted(start_ts)
        except Exception as exc:
            abort_with(context, exc)
        if outcome == ABORTED:
            return pb.StatusResponse(state=pb.TRANSACTION_STATE_ABORTED, start_ts=start_ts)
        return pb.StatusResponse(
            state=pb.TRANSACTION_STATE_COMMITTED, start_ts=start_ts, commit_ts=outcome
        )


class SettleIgnoresReadOnlyServicer(SettleIgnoresSafePointServicer):
    """TEST BUILD, BROKEN ON PURPOSE: settles an owner that wrote nothing as
    :class:`SettleIgnoresSafePointServicer` settles every transaction, by fencing or
    writing ABORTED, so a read-only commit whose reply was lost is told it aborted
    (issue 30 item 4); writers are settled as the fixed gateway settles them, so that
    only this bug can be found."""

    ignores_read_only = True


def gc_grace_ms_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """``PERCOLAKE_TEST_GC_GRACE_MS`` as an int; ``None`` when unset or empty."""
    env = os.environ if environ is None else environ
    raw = env.get(TEST_GC_GRACE_ENV, "")
    if not raw:
        return None
    grace_ms = int(raw)
    if grace_ms < 0:
        raise ValueError(f"{TEST_GC_GRACE_ENV} must be >= 0, got {raw!r}")
    return grace_ms


def collecting(
    gateway_class: type[TransactionServicer], interval_s: float, retention_s: float, grace_ms: int
) -> type[TransactionServicer]:
    """TEST BUILD: ``gateway_class`` that runs garbage collection as ``percolake serve
    --gc-interval-s`` does (a :class:`~txn.GcLoop` on the gateway's store, oracle and
    locks), with a grace of ``grace_ms`` instead of the default 5 s.

    For chaos runs (``--gc-grace-ms``): with a short grace, passes follow each other
    closely, so transactions-table entries are collected within about a second of the
    commit, while a client whose reply was lost is still settling. The installed command
    has no such option: a short grace costs every reader a read of the safe point per
    ``grace / 2``.
    """

    class Collecting(gateway_class):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            rt = self._tm._rt
            collector = GarbageCollector(
                rt.store,
                timestamps=rt.timestamps,
                locks=rt.locks,
                retention_s=retention_s,
                grace_ms=grace_ms,
                config=rt.config,
            )
            self._gc_loop = GcLoop(collector, interval_s)
            log.critical(
                "%s=%d: this gateway collects garbage every %g s with a grace of %d ms "
                "(retention %g s); a test build",
                TEST_GC_GRACE_ENV,
                grace_ms,
                interval_s,
                grace_ms,
                retention_s,
            )

        def shutdown(self) -> None:
            self._gc_loop.close()
            super().shutdown()

    Collecting.__name__ = Collecting.__qualname__ = f"Collecting{gateway_class.__name__}"
    return Collecting


def _configure(steering: _Steering, name: bytes, value: bytes) -> None:
    if name == COMMIT_DELAY_MS:
        steering.commit_delay_ms = int(value)
    elif name == COMMIT_REPLY:
        if value not in (b"lose", b"drop", b""):
            raise ValueError(f"commit.reply must be lose or drop, got {value!r}")
        steering.commit_reply = value.decode()
    elif name == SCAN_BATCH_SIZE:
        steering.scan_batch_size = int(value)
    elif name == SCAN_LOCKSTEP:
        steering.lockstep = value == b"1"
    else:
        raise ValueError(f"unknown fail point {name!r}")


def _await_permit(steering: _Steering, this_scan: int, context: grpc.ServicerContext) -> None:
    deadline = time.monotonic() + LOCKSTEP_MAX_WAIT_S
    with steering.changed:
        while steering.permits == 0:
            if steering.finished or steering.scans != this_scan or not context.is_active():
                return
            if time.monotonic() > deadline:
                log.warning("lockstep scan got no permission in %.0f s", LOCKSTEP_MAX_WAIT_S)
                return
            steering.changed.wait(_POLL_S)
        steering.permits -= 1


def _lose_reply(context: grpc.ServicerContext, what: str) -> None:
    context.abort(grpc.StatusCode.UNAVAILABLE, f"test fail point: commit reply {what}")


# --- the lakehouse service's group commits ------------------------------------------------


def read_lakehouse_control(path: str | None) -> dict[str, Any]:
    """The control file's object; ``{}`` when there is none (or no file yet)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            control = json.load(f)
    except FileNotFoundError:
        return {}
    if not isinstance(control, dict):
        raise ValueError(f"{path}: the lakehouse control must be a JSON object")
    return control


def write_lakehouse_control(path: str, control: Mapping[str, Any]) -> None:
    """Replace the control file atomically (for tests: the gateway may be reading it)."""
    _write_atomically(path, control)


def fired_path(control_path: str, rule_id: str) -> str:
    """Where the gateway reports that rule ``rule_id`` fired."""
    return f"{control_path}.{rule_id}.fired"


def _write_atomically(path: str, value: Mapping[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(tmp, path)


class SteeredGroupCommitter(GroupCommitter):
    """TEST BUILD: group commits that hold, block or lose replies as a control file says.

    See the module docstring for the file's format.
    """

    def __init__(self, limits: LakehouseLimits) -> None:
        super().__init__(limits)
        self._control_path = os.environ.get(LAKEHOUSE_CONTROL_ENV)
        self._held = False
        self._fired: set[str] = set()
        self._guard = threading.Lock()

    def _drain(self, catalog: Catalog, name: str, queue: TableQueue) -> None:
        # The worker of a table's queue forms its groups in ``_drain``; holding it here,
        # before it takes anything, is what makes the first group's size exact (a hold
        # in ``before_group`` would come after the group was taken, whatever queued).
        with self._guard:
            first, self._held = not self._held, True
        hold_until = read_lakehouse_control(self._control_path).get("hold_first_group_until")
        if first and isinstance(hold_until, int):
            self._hold(queue, hold_until)
        super()._drain(catalog, name, queue)

    def before_group(self, name: str, requests: list[CommitRequest]) -> None:
        self._apply_rules(read_lakehouse_control(self._control_path), "before", requests)

    def after_group(self, name: str, requests: list[CommitRequest]) -> None:
        self._apply_rules(read_lakehouse_control(self._control_path), "after", requests)

    def _hold(self, queue: TableQueue, until: int) -> None:
        deadline = time.monotonic() + HOLD_MAX_WAIT_S
        while True:
            with self._lock:  # the lock the base class queues requests under
                queued = len(queue.pending)
            if queued >= until:
                return
            if time.monotonic() > deadline:
                log.warning(
                    "first group held %.0f s; %d of %d requests came",
                    HOLD_MAX_WAIT_S,
                    queued,
                    until,
                )
                return
            time.sleep(0.005)

    def _apply_rules(
        self, control: Mapping[str, Any], at: str, requests: list[CommitRequest]
    ) -> None:
        for rule in control.get("rules", []):
            rule_id = str(rule["id"])
            if rule.get("at") != at or len(requests) < int(rule.get("min_size", 1)):
                continue
            with self._guard:
                if rule_id in self._fired:
                    continue
                self._fired.add(rule_id)
            assert self._control_path is not None
            _write_atomically(
                fired_path(self._control_path, rule_id),
                {"pid": os.getpid(), "at": at, "job_ids": [r.job_id for r in requests]},
            )
            action = rule.get("action")
            log.warning(
                "test rule %s fires %s a group of %d: %s", rule_id, at, len(requests), action
            )
            if action == "block":
                self._block(rule_id)
            elif action == "unknown":
                raise CommitUnknownError(
                    f"test fail point {rule_id}: the reply of a group is lost {at} its commit",
                    start_ts=-1,
                )
            else:
                raise ValueError(f"unknown action {action!r} of test rule {rule_id}")

    def _block(self, rule_id: str) -> None:
        deadline = time.monotonic() + BLOCK_MAX_WAIT_S
        while time.monotonic() < deadline:
            rules = read_lakehouse_control(self._control_path).get("rules", [])
            if all(str(r["id"]) != rule_id for r in rules):
                return
            time.sleep(_POLL_S)
        log.warning("test rule %s blocked %.0f s; going on", rule_id, BLOCK_MAX_WAIT_S)


class SteeredLakehouseServicer(LakehouseServicer):
    """TEST BUILD: the ``LakehouseService`` whose group commits a control file steers.

    Passed explicitly as the lakehouse class of a test server (the ``lakehouse_class``
    of its :class:`~percolake.serve.testing.TestBuild`); nothing is patched.
    """

    committer_class = SteeredGroupCommitter

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log.critical(
            "%s=1: this gateway's lakehouse commits obey the test control file %s=%s; "
            "it exists only for tests",
            SERVE_FAILPOINTS_ENV,
            LAKEHOUSE_CONTROL_ENV,
            os.environ.get(LAKEHOUSE_CONTROL_ENV, ""),
        )
