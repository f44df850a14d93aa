"""One replica of the control plane: the oracle and the lock table of whoever leads.

``percolake serve`` started several times on one store makes replicas. Each runs a
:class:`tso.LeaderLease` on the store's ``tso`` leader row. The leader builds, per
term, a :class:`tso.TimestampOracle` (which takes over the persisted bound and serves
only while the lease is valid) and an empty :class:`lockserver.LockTable` (a new epoch:
tokens of the old term are refused, which costs aborts and waits, never an anomaly,
rule S5); when the term ends, its oracle and lock table are closed, so nothing is
handed out or granted in it afterwards. A replica that cannot start a term (the bound
cannot be taken) steps down instead of holding the row. On stores whose claims are
exclusive (SQLite), the leader also holds the store's ``oracle`` claim for its term,
which lets a replica restarted after a crash take over at once. A follower forwards
each call to the leader named in the row, marked as forwarded so that it is never
forwarded twice.

:class:`ControlPlane` is both a :class:`~txn._services.TimestampSource` and a
:class:`~txn._services.LockService`, for the gRPC servicers and for the replica's own
gateway: a call waits up to ``failover_s`` for a leader (during an election or while a
dead leader's lease runs out) before it fails as unavailable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from lockserver import LockTable, LockTableClosedError, LockToken, LockWait
from lockserver.lock_service import RemoteLockService
from storage_adapters import KVStore, StoreError
from tso import (
    DEFAULT_LEADER_WAIT_S,
    DEFAULT_LEASE_MS,
    DRIFT_MARGIN,
    ORACLE_ROLE,
    LeaderLease,
    LeaseRecord,
    LeaseView,
    RateLimitedWarning,
    TimestampBatcher,
    TimestampOracle,
    TimestampRange,
)
from tso.timestamp_service import RemoteTimestampSource
from wire.auth import TlsConfig
from wire.channels import FORWARDED_KEY, Connection
from wire.error_codes import NoLeaderError
from wire.errors import OracleFencedError, ServiceUnavailableError, StaleTokenError

log = logging.getLogger(__name__)

#: A follower that could not reach a renewing leader for this many leases deposes it.
DEPOSE_AFTER_LEASES = 3
#: Health: a leader row unchanged this many leases means that no election is under
#: way any more (a takeover ends 1 + DRIFT_MARGIN leases after the last renewal, plus
#: a round of an eighth lease), so no leader can be had.
TAKEOVER_LEASES = 2 + DRIFT_MARGIN

T = TypeVar("T")


class NotLeaderError(ServiceUnavailableError):
    """This replica does not lead and the call may not be forwarded (again)."""


class _Term:
    """What a leader serves in one term."""

    def __init__(self, epoch: int, oracle: TimestampOracle | None) -> None:
        self.epoch = epoch
        self._oracle = oracle
        self.timestamps = None if oracle is None else TimestampBatcher(oracle.next_range)
        self.locks = LockTable()

    @property
    def oracle(self) -> TimestampOracle:
        if self._oracle is None:
            raise ValueError("this replica set serves locks only, not timestamps")
        return self._oracle

    def next_timestamp(self) -> int:
        if self.timestamps is None:
            raise ValueError("this replica set serves locks only, not timestamps")
        return self.timestamps.next_timestamp()

    def close(self) -> None:
        """The term ended: its grants end with it (S5), and waiting calls go elsewhere."""
        self.locks.close()
        if self._oracle is not None:
            self._oracle.close()


class _Forward:
    """Clients of the leader at one address, for forwarded calls."""

    def __init__(
        self, address: str, token: str | None, tls: TlsConfig | None, timeout_s: float
    ) -> None:
        self.address = address
        self.conn = Connection(address, token=token, tls=tls)
        self.conn.metadata = (*self.conn.metadata, (FORWARDED_KEY, "1"))
        # A leader that stops answering is replaced after about a lease: a call waits
        # no longer than that on it, then asks whoever leads by then.
        self.timestamps = RemoteTimestampSource(self.conn, timeout_s=timeout_s)
        self.locks = RemoteLockService(self.conn, timeout_s=timeout_s)
        self.closed = False

    def close(self) -> None:
        """Cancel the calls waiting on this leader (another leads now)."""
        self.closed = True
        self.conn.close()


class ControlPlane:
    """The oracle and lock service of a replica set, as seen from one replica."""

    def __init__(
        self,
        store: KVStore,
        *,
        role: str = "tso",
        lease_ms: int = DEFAULT_LEASE_MS,
        token: str | None = None,
        tls: TlsConfig | None = None,
        failover_s: float = DEFAULT_LEADER_WAIT_S,
        check_lease: bool = True,
    ) -> None:
        """``check_lease=False`` exists only for the test build that shows the timestamp
        workload catches a leader serving without a valid lease (rule S7)."""
        self._store = store
        self._token, self._tls = token, tls
        self.failover_s = failover_s
        self._lock = threading.Lock()
        self._term: _Term | None = None
        self._forward: _Forward | None = None
        self._unreachable_since: float | None = None
        self._closed = False
        #: Replicas of ``serve locks`` elect on a row of their own and keep no oracle.
        self._timestamps = role == "tso"
        self.lease = LeaderLease(
            store,
            role,
            lease_ms=lease_ms,
            on_change=self._on_change,
            on_row=self._on_row,
            check_validity=check_lease,
            # Replicas of serve and serve tso hold the oracle's claim (one oracle per
            # store, embedded ones included); serve locks replicas a claim of their own.
            claim_role=ORACLE_ROLE if role == "tso" else f"leader-{role}",
        )
        self._term_changed = threading.Condition(self._lock)
        self._no_leader_warning = RateLimitedWarning(log)

    def start(self, address: str) -> None:
        """Begin electing, advertising ``address`` (where this replica serves).

        The first round runs here, so a replica alone on a fresh store leads at once.
        """
        self.lease.address = address
        try:
            self.lease.step()
        except StoreError as exc:
            log.warning("%s: first leader election round failed: %s", self.lease.name, exc)
        self.lease.start()

    # --- terms ---------------------------------------------------------------------

    def _on_change(self, epoch: int | None) -> None:
        if epoch is None:
            with self._lock:
                old, self._term = self._term, None
                self._term_changed.notify_all()
            if old is not None:
                old.close()
            return
        # Take over the bound before the lease turns valid: everything the old leader
        # could have served lies below it (S7). If that fails, the error makes the lease
        # step down: a replica that cannot serve the term must not hold the row.
        oracle = None
        if self._timestamps:
            try:
                oracle = TimestampOracle(self._store, lease=self.lease)
            except (StoreError, OracleFencedError) as exc:
                log.error(
                    "%s: epoch %d: could not take over the timestamp bound: %s",
                    self.lease.name,
                    epoch,
                    exc,
                )
                raise
        with self._lock:
            self._term = _Term(epoch, oracle)
            self._term_changed.notify_all()

    def _on_row(self, record: LeaseRecord | None) -> None:
        """A new leader (or none): calls still waiting on the old one are cancelled, and
        sent again to the new one."""
        address = None if record is None or not record.live else record.address
        with self._lock:
            forward = self._forward
            if forward is None or forward.address == address:
                return
            self._forward = None
            self._unreachable_since = None  # a new leader: count its failures afresh
        forward.close()

    def _local(self) -> _Term | None:
        term = self._term
        if term is not None and self.lease.valid_for(term.epoch):
            return term
        return None

    def _leader(self) -> _Forward | None:
        address = self.lease.leader_address()
        if address is None or address == self.lease.address:
            return None
        forward = self._forward
        if forward is None or forward.address != address:
            with self._lock:
                if self._forward is None or self._forward.address != address:
                    if self._forward is not None:
                        self._forward.close()
                    self._forward = _Forward(
                        address, self._token, self._tls, max(0.5, self.lease.lease_ms / 1000)
                    )
                forward = self._forward
        return forward

    def _route(
        self,
        local: Callable[[_Term], T],
        remote: Callable[[_Forward], T],
        *,
        forwarded: bool,
        what: str,
    ) -> T:
        """Serve locally when leading, else forward to the leader; wait for one."""
        deadline = time.monotonic() + self.failover_s
        last: Exception | None = None
        while not self._closed:
            term = self._local()
            if term is not None:
                self._unreachable_since = None
                try:
                    result = local(term)
                except (OracleFencedError, LockTableClosedError) as exc:
                    last = exc  # the lease ran out, or the term ended, mid-call
                else:
                    self._served()
                    return result
            elif not forwarded and (forward := self._leader()) is not None:
                try:
                    result = remote(forward)
                except (ServiceUnavailableError, OracleFencedError) as exc:
                    last = exc
                    if not forward.closed:  # not our own doing: a new leader closed it
                        self._leader_unreachable(forward, exc)
                except ValueError as exc:
                    # "Cannot invoke RPC on closed channel": a new leader closed the old
                    # forwarding channel before this call started; nothing was sent.
                    if not forward.closed:
                        raise
                    last = exc
                else:
                    self._unreachable_since = None
                    self._served()
                    return result
            elif forwarded:
                raise NotLeaderError(f"replica {self.lease.address} does not lead ({what})")
            if time.monotonic() >= deadline:
                break
            with self._lock:
                self._term_changed.wait(min(0.05, self.lease.lease_ms / 8000))
        error = NoLeaderError(
            f"no leader for {self.lease.role} within {self.failover_s:g} s: {self._cause(last)}"
        )
        self._no_leader_warning.warning("%s: %s (asked for %s)", self.lease.name, error, what)
        raise error

    def _served(self) -> None:
        if self._no_leader_warning.active:
            self._no_leader_warning.ended("%s: %s served again", self.lease.name, self.lease.role)

    def _cause(self, last: Exception | None) -> str:
        """Why no leader served: what an operator must fix."""
        if self._closed:
            return f"replica {self.lease.name} is shutting down"
        if self.lease.store_error is not None:
            return f"store unreachable: {self.lease.store_error}"
        record = self.lease.leader()
        if record is None:
            return "no replica has taken the leader row yet"
        if self.lease.step_down_reason is not None and not self.lease.valid():
            return f"this replica ({self.lease.name}) {self.lease.step_down_reason}"
        if record.holder == self.lease.id and record.live:
            return (
                f"this replica ({self.lease.name}) holds epoch {record.epoch} but its lease "
                "is not valid (its renewals do not reach the store in time)"
            )
        if not record.live:
            state = "released" if record.released else "deposed"
            return f"the leader of epoch {record.epoch} was {state}; no replica took over yet" + (
                f" (last error: {last})" if last else ""
            )
        if not record.address:
            return (
                f"epoch {record.epoch} is held by an embedded oracle "
                f"({record.holder[:8]}), which serves only its own process"
            )
        return f"leader {record.address} (epoch {record.epoch}) did not serve" + (
            f": {last}" if last else ""
        )

    def _leader_unreachable(self, forward: _Forward, exc: Exception) -> None:
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
            return
        patience = DEPOSE_AFTER_LEASES * self.lease.lease_ms / 1000
        if now - self._unreachable_since >= patience and self.lease.depose(
            f"{forward.address} unreachable from here: {exc}"
        ):
            self._unreachable_since = None

    # --- TimestampSource -------------------------------------------------------------

    def next_range(self, count: int, *, forwarded: bool = False) -> TimestampRange:
        return self._route(
            lambda term: term.oracle.next_range(count),
            lambda leader: leader.timestamps.next_range(count),
            forwarded=forwarded,
            what="timestamps",
        )

    def next_timestamp(self) -> int:
        return self._route(
            lambda term: term.next_timestamp(),
            lambda leader: leader.timestamps.next_timestamp(),
            forwarded=False,
            what="a timestamp",
        )

    # --- LockService ---------------------------------------------------------------

    def lock(
        self,
        descriptors: Iterable[bytes],
        owner: str,
        lease_ms: int,
        wait_timeout_ms: int = 0,
        priority: int | None = None,
        *,
        forwarded: bool = False,
    ) -> LockToken | None:
        wanted = list(descriptors)
        return self._route(
            lambda term: term.locks.lock(wanted, owner, lease_ms, wait_timeout_ms, priority),
            lambda leader: leader.locks.lock(wanted, owner, lease_ms, wait_timeout_ms, priority),
            forwarded=forwarded,
            what="locks",
        )

    def refresh(
        self, token: LockToken, lease_ms: int | None = None, *, forwarded: bool = False
    ) -> bool:
        return self._route(
            lambda term: self._check_epoch(term, token) and term.locks.refresh(token, lease_ms),
            lambda leader: leader.locks.refresh(token, lease_ms),
            forwarded=forwarded,
            what="a lock refresh",
        )

    def unlock(self, token: LockToken, *, forwarded: bool = False) -> bool:
        return self._route(
            lambda term: self._check_epoch(term, token) and term.locks.unlock(token),
            lambda leader: leader.locks.unlock(token),
            forwarded=forwarded,
            what="an unlock",
        )

    def wait_until_released(
        self, descriptors: Iterable[bytes], timeout_ms: int, *, forwarded: bool = False
    ) -> bool:
        wanted = list(descriptors)
        return self._route(
            lambda term: term.locks.wait_until_released(wanted, timeout_ms),
            lambda leader: leader.locks.wait_until_released(wanted, timeout_ms),
            forwarded=forwarded,
            what="a lock wait",
        )

    def epoch(self, *, forwarded: bool = False) -> int:
        return self._route(
            lambda term: term.locks.epoch,
            lambda leader: leader.locks.epoch(),
            forwarded=forwarded,
            what="the lock epoch",
        )

    @staticmethod
    def _check_epoch(term: _Term, token: LockToken) -> bool:
        if token.epoch != term.locks.epoch:
            raise StaleTokenError(
                f"lock token from epoch {token.epoch}: the lock table changed hands "
                f"(now epoch {term.locks.epoch}) and every lock of the old one is gone"
            )
        return True

    # --- status ----------------------------------------------------------------------

    def view(self) -> LeaseView:
        return self.lease.view()

    def locks_held(self) -> int:
        term = self._local()
        return 0 if term is None else len(term.locks)

    def lock_waits(self, limit: int) -> list[LockWait]:
        """The longest waits in the leader's table; a follower has none (as with
        :meth:`locks_held`, the leader's own status tells them)."""
        term = self._local()
        return [] if term is None else term.locks.waits(limit)

    def serving_problem(self) -> str | None:
        """Why this replica cannot serve its role now, for health checks; ``None`` when
        it can: it leads under a valid lease, or a live leader renews the row and
        answers the calls forwarded to it.

        An election in progress is no problem: calls wait for it (a takeover ends about
        1.1 lease after the last renewal, plus a round). A row left unchanged for longer
        than ``TAKEOVER_LEASES`` leases means no one took over."""
        if self._closed:
            return f"replica {self.lease.name} is shutting down"
        if self.lease.store_error is not None:
            return f"store unreachable: {self.lease.store_error}"
        if self._local() is not None:
            return None
        record = self.lease.leader()
        age = self.lease.row_age_s()
        if age is None:
            return "the leader row was not read yet"
        lease_s = self.lease.lease_ms / 1000
        electing = age < TAKEOVER_LEASES * lease_s
        if record is not None and record.live and not record.address:
            return (
                f"epoch {record.epoch} is held by an embedded oracle ({record.holder[:8]}), "
                "which serves only its own process"
            )
        if record is None or not record.live or record.holder == self.lease.id:
            if electing:
                return None
            if record is None:
                return f"no replica took the leader row in {age:.1f} s"
            if record.holder == self.lease.id:
                return (
                    f"this replica holds epoch {record.epoch} but its lease is not valid "
                    "(its renewals do not reach the store in time)"
                )
            state = "released" if record.released else "deposed"
            return (
                f"the leader of epoch {record.epoch} was {state} {age:.1f} s ago; "
                "no replica took over"
            )
        if not electing:
            return (
                f"leader {record.address} (epoch {record.epoch}) has not renewed its lease "
                f"for {age:.1f} s and no replica took over"
            )
        since = self._unreachable_since
        if since is not None and time.monotonic() - since >= lease_s:
            return (
                f"leader {record.address} (epoch {record.epoch}) unreachable from here for "
                f"{time.monotonic() - since:.1f} s"
            )
        return None

    def close(self) -> None:
        """Stop electing and serving; a leader hands its row over first."""
        self._closed = True
        self.lease.release()
        with self._lock:
            forward, self._forward = self._forward, None
        if forward is not None:
            forward.close()
