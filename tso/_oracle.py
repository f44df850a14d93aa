"""The timestamp oracle: strictly increasing timestamps with a persisted upper bound (S7)."""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from storage_adapters import Claim, KVStore, StoreClaimedError, StoreError
from wire import metrics
from wire.errors import OracleFencedError

if TYPE_CHECKING:
    from tso._lease import LeaderLease

log = logging.getLogger(__name__)

#: System table and row that hold the oracle's persisted upper bound.
TSO_TABLE = "_tso"
BOUND_KEY = b"bound"

#: How many timestamps one bound extension reserves. Large enough that extensions
#: (one compare-and-set each) are rare at millions of timestamps per second; a
#: restart skips at most this many timestamps, which costs nothing.
DEFAULT_WINDOW = 1_000_000

#: Timestamps start here on a fresh store; 0 stays free as "before everything".
FIRST_TIMESTAMP = 1

#: The role an oracle claims on its store (for SQLite: ``<db>.oracle.lock``).
ORACLE_ROLE = "oracle"


class OracleAlreadyRunningError(OracleFencedError):
    """Another oracle holds this store's oracle claim: this one refuses to start (S7).

    Raised before the new oracle touches the bound, so the running one is not
    disturbed. ``where`` is what the claim is held on (a lock file) and ``holder`` who
    holds it (``"pid 1234"``) as far as the store can tell.
    """

    def __init__(self, message: str, *, where: str, holder: str | None) -> None:
        super().__init__(message)
        self.where = where
        self.holder = holder


@dataclass(frozen=True, slots=True)
class TimestampRange:
    """``count`` consecutive timestamps starting at ``first``."""

    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def _encode_bound(bound: int, owner: str) -> bytes:
    return f"{bound} {owner}".encode()


def _decode_bound(raw: bytes) -> int:
    try:
        return int(raw.split(b" ", 1)[0])
    except ValueError as exc:
        raise StoreError(f"corrupt oracle bound row {raw!r}") from exc


class TimestampOracle:
    """Hands out strictly increasing timestamps, singly or in ranges.

    Before serving a timestamp at or above its persisted bound, the oracle moves
    the bound up with compare-and-set against the exact value it last wrote. A
    restart therefore starts above everything an earlier incarnation could have
    served.

    Two oracles must never serve together: the old one would keep serving from its
    window (up to ``window`` timestamps) after the new one moved the bound, and
    timestamps would interleave. So an oracle first claims its store's ``oracle`` role
    (:meth:`KVStore.claim`; an OS file lock for SQLite) and holds it while it lives;
    a second oracle raises :class:`OracleAlreadyRunningError` before touching the
    bound. The claim is released by :meth:`close` or by closing the store, after
    which this oracle serves nothing more.

    Replicas of ``percolake serve`` on one store are kept apart by a leader lease
    instead (:class:`tso.LeaderLease`): an oracle given ``lease`` takes no claim, is
    built when its replica starts a term, and hands out a range only while the lease is
    valid by this process's clock, checked after any extension of the bound. Behind
    both, the fencing: a second oracle changes the bound row, so the first one's next
    extension fails and it raises :class:`OracleFencedError` from then on.
    """

    def __init__(
        self,
        store: KVStore,
        *,
        window: int = DEFAULT_WINDOW,
        claim_store: bool = True,
        lease: LeaderLease | None = None,
        leader_lease_ms: int | None = None,
    ) -> None:
        """``leader_lease_ms``: the lease of an oracle of its own (no ``lease`` given;
        default :data:`tso._lease.DEFAULT_LEASE_MS`). ``claim_store=False`` without a
        lease exists only for test builds that show the checks catch two oracles
        serving together; it removes the protection of rule S7."""
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        self._store = store
        self._window = window
        self._owner = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._fenced = False
        self._persisted: bytes | None = None
        #: The bound row an extension wrote when its compare-and-set failed without
        #: saying whether it applied; settled before the next extension.
        self._in_doubt: bytes | None = None
        self._own_lease: LeaderLease | None = None
        #: The term this oracle serves in: a later term of the same replica gets a new
        #: oracle (replicas) or takes the bound again (:meth:`_on_term`, embedded).
        self._term: int | None = None
        self._next = self._bound = 0
        if lease is not None:
            self._claim = KVStore.claim(store, ORACLE_ROLE)  # the lease guards instead
            self._term = lease.epoch
        elif claim_store:
            self._claim = self._claim_store(store)
        else:
            log.critical("timestamp oracle on %s starts WITHOUT claiming its store", store.url)
            self._claim = KVStore.claim(store, ORACLE_ROLE)  # the base claim guards nothing
        self._lease = lease
        try:
            if lease is None and claim_store:
                # Takes the bound in its first term (_on_term), before serving.
                self._lease = self._own_lease = self._lead_alone(
                    store, self._claim, leader_lease_ms
                )
            else:
                self._next, self._bound = self._take_over()
        except BaseException:
            self._release()
            raise
        log.info(
            "timestamp oracle %s serving from %d on %s", self._owner[:8], self._next, store.url
        )

    @staticmethod
    def _claim_store(store: KVStore) -> Claim:
        try:
            return store.claim(ORACLE_ROLE)
        except StoreClaimedError as exc:
            raise OracleAlreadyRunningError(
                f"another timestamp oracle already serves {store.url}: {exc.where} is held "
                f"by {exc.holder or 'another process'}. Only one oracle may serve a store "
                "(rule S7): stop that one first, or point this one at another store",
                where=exc.where,
                holder=exc.holder,
            ) from exc

    def _lead_alone(self, store: KVStore, claim: Claim, lease_ms: int | None = None) -> LeaderLease:
        """An oracle of its own (embedded) still takes the leader lease, so that it never
        serves beside ``percolake serve`` replicas of the same store."""
        from tso._lease import DEFAULT_LEASE_MS, DRIFT_MARGIN, LeaderLease

        lease = LeaderLease(
            store,
            "tso",
            claim=claim,
            on_change=self._on_term,
            lease_ms=DEFAULT_LEASE_MS if lease_ms is None else lease_ms,
        )
        # A holder that stopped renewing (it crashed) is waited out once, unless the
        # claim, which we hold, proves it gone.
        if not lease.acquire(timeout_s=lease.lease_ms / 1000 * (1 + DRIFT_MARGIN) + 1.0):
            lease.release()
            leader = lease.leader()
            where = "the leader row" if leader is None else f"epoch {leader.epoch}"
            at = f" at {leader.address}" if leader is not None and leader.address else ""
            raise OracleAlreadyRunningError(
                f"a percolake serve replica{at} leads {store.url} ({where}) and renews its "
                "lease. Only the leader may serve timestamps (rule S7): connect with "
                "TransactionManager.remote instead, or stop the replicas first",
                where=f"{store.url} leader row",
                holder=leader.address if leader is not None else None,
            )
        lease.start()
        return lease

    def _on_term(self, epoch: int | None) -> None:
        """Our own lease (embedded) starts a term: serve it, from a freshly taken bound.

        A term lost to a replica (this process was paused) may be followed by a later
        one (that replica died): the oracle serves it as a new oracle would, instead of
        holding the leader row while refusing every call. If the bound cannot be taken,
        this raises and the lease steps down. The end of a term needs nothing here:
        :meth:`next_range` checks the term at every hand-out.
        """
        if epoch is None:
            return
        with self._lock:
            self._next, self._bound = self._take_over()
            self._in_doubt = None
            self._fenced = False  # the bound is ours again, taken afresh
            self._term = epoch

    def _release(self) -> None:
        self._claim.release()
        if self._own_lease is not None:
            self._own_lease.release()

    def _take_over(self) -> tuple[int, int]:
        # Retried only while other oracles start at the same moment; each lost
        # compare-and-set means someone else moved the bound, so re-read it.
        for _ in range(100):
            current = self._store.get_system(TSO_TABLE, [BOUND_KEY]).get(BOUND_KEY)
            start = FIRST_TIMESTAMP if current is None else _decode_bound(current)
            new = _encode_bound(start + self._window, self._owner)
            if self._store.compare_and_set(TSO_TABLE, BOUND_KEY, current, new).applied:
                self._persisted = new
                return start, start + self._window
        raise OracleFencedError("could not take over the timestamp bound: too much contention")

    def _extend(self, needed: int) -> None:
        if self._in_doubt is not None:
            self._settle_in_doubt()
            if self._next + needed <= self._bound:
                return  # the extension in doubt had applied and covers this request
        new_bound = max(self._bound, self._next + needed) + self._window
        new = _encode_bound(new_bound, self._owner)
        try:
            result = self._store.compare_and_set(TSO_TABLE, BOUND_KEY, self._persisted, new)
        except StoreError:
            # A timed-out (or otherwise failed) compare-and-set may have applied, as
            # a commit point may (rule S6). Comparing the next extension against
            # the old value would then fail and fence this oracle for good although
            # the row holds its own value. Settle it by reading the row back.
            self._in_doubt = new
            self._settle_in_doubt()  # a read failing here leaves it for the next call
            if self._next + needed <= self._bound:
                return
            raise
        if not result.applied and result.current != new:
            # (Finding our own value means an earlier attempt of this very write
            # applied, e.g. resent by the driver after Paxos v1 answered Unavailable.)
            self._fence(result.current)
        self._persisted = new
        self._bound = new_bound

    def _settle_in_doubt(self) -> None:
        """Decide an extension whose compare-and-set failed: did it apply?"""
        assert self._in_doubt is not None
        current = self._store.get_system(TSO_TABLE, [BOUND_KEY]).get(BOUND_KEY)
        if current == self._in_doubt:  # it applied: the bound is ours and higher
            self._persisted, self._bound = current, _decode_bound(current)
        elif current != self._persisted:
            self._fence(current)
        self._in_doubt = None  # applied, or the row is as before: a fresh attempt is safe

    def _fence(self, current: bytes | None) -> NoReturn:
        self._fenced = True
        log.error("timestamp oracle %s fenced: bound row now %r", self._owner[:8], current)
        raise OracleFencedError("another timestamp oracle took over this store; refusing to serve")

    def next_range(self, count: int) -> TimestampRange:
        """Reserve ``count`` consecutive timestamps, all above any served before."""
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"count must be int, got {type(count).__name__}")
        if count < 1:
            raise ValueError(f"count must be positive, got {count}")
        with self._lock:
            if self._fenced:
                raise OracleFencedError("this timestamp oracle was fenced by another")
            if not self._claim.held:
                # Another oracle may hold the store now: serving from our window would
                # interleave with it.
                raise OracleFencedError("this timestamp oracle was closed")
            if self._next + count > self._bound:
                self._extend(count)
            if self._lease is not None and not self._lease.valid_for(self._term):
                # After a pause or a slow extension: a new leader may serve by now.
                raise OracleFencedError(
                    "this replica's leader lease ran out; another replica may lead now"
                )
            first = self._next
            self._next += count
            metrics.TIMESTAMPS_SERVED.inc(count)
            return TimestampRange(first, count)

    def next_timestamp(self) -> int:
        """One fresh timestamp."""
        return self.next_range(1).first

    @property
    def fenced(self) -> bool:
        return self._fenced

    def close(self) -> None:
        """Stop serving and release the store's oracle claim. Idempotent.

        The store stays open (the oracle does not own it); closing the store also
        releases the claim and stops this oracle.
        """
        # Under the oracle's lock: once the claim is free, another process may take it
        # as proof that this oracle stopped, so no hand-out may still be under way.
        with self._lock:
            self._claim.release()
        if self._own_lease is not None:
            self._own_lease.release()

    def __enter__(self) -> TimestampOracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
