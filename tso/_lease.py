"""Leader leases on a store row: which replica of the control plane serves (rule S7).

Several ``percolake serve`` replicas run on one store; one of them leads and serves
timestamps and locks. Leadership is a lease on one system row per role, taken and
renewed with the store's linearizable compare-and-set (a Cassandra lightweight
transaction, a SQLite transaction):

* The row holds ``epoch`` (one per term, strictly increasing), ``holder``, the
  holder's ``address``, the lease length and a renewal counter, so every renewal
  changes the row.
* **The leader** renews every ``lease_ms / 4``. A renewal sent at ``t0`` on its own
  monotonic clock that applied makes the lease valid until ``t0 + lease_ms * (1 -
  DRIFT_MARGIN)``. It serves only while :meth:`LeaderLease.valid` says so. A renewal
  that fails to apply (the row changed) ends its term at once; one that cannot reach
  the store leaves the lease to run out by itself.
* **A follower** reads the row every ``lease_ms / 8`` and notes, on its own monotonic
  clock, when it first saw the current value. It takes over only after the value has
  stayed the same for ``lease_ms * (1 + DRIFT_MARGIN)``: every renewal the old
  leader made was written before the follower saw it, so by then the old lease has run
  out in real time, as long as neither clock's rate drifts by more than the margin.
  A leader that releases its lease (a graceful stop) stops serving first, so its
  row may be taken over at once.
* **The new leader** then takes over the oracle's persisted bound (compare-and-set,
  :class:`tso.TimestampOracle`): everything the old leader could have served lies
  below that bound, and the old leader can no longer extend it.

Clock assumption: bounded clock drift *rate* (at most ``DRIFT_MARGIN``, 10 %) between
replicas, and no synchronised clocks; pauses (GC, SIGSTOP) are fine because validity
is checked when a timestamp is handed out, after any pause.

**Proof that the holder is gone.** On stores whose claims are exclusive OS locks (SQLite:
a lock on the database file itself), a leader holds the store's claim of its role for
its whole term and marks its row ``claimed``; it lets go only after its term ended here
(it serves nothing more), or when its process dies. A follower that then gets the
claim knows the holder of a ``claimed`` row has stopped serving, and takes over at
once instead of waiting out the lease: a restart after ``kill -9`` is not slowed by the
dead leader's lease. Without the claim (busy, or a store that cannot tell) it waits.

**A term it cannot serve is not held.** ``on_change(epoch)`` readies what the new term
serves (the oracle takes over the bound); if it fails, the replica steps down at once:
it releases the row it just wrote (it served nothing in that term) and sits out one
takeover, instead of renewing a row no one can be served under.

A follower that cannot reach a leader which still renews (a partition that cuts the
leader off from its clients but not from the store) may *depose* it: it writes the row
with ``deposed`` set. The leader's next renewal fails and its term ends; everyone,
the deposing follower included, then waits out the lease as above before taking over.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

from storage_adapters import Claim, KVStore, StoreError
from tso._holder_claim import HolderClaim
from wire import metrics

log = logging.getLogger(__name__)

#: System table of the leader rows, one row per role (``tso``, ``locks``).
LEADER_TABLE = "_leader"
#: Default lease length: a leader kill costs about this much plus a poll.
DEFAULT_LEASE_MS = 2000
#: How long a call to a replica waits for a leader (an election, a store outage) before
#: it fails naming the cause (``percolake serve --leader-wait-s``).
DEFAULT_LEADER_WAIT_S = 15.0
#: The largest relative drift of clock rates between replicas the protocol tolerates.
DRIFT_MARGIN = 0.1
MIN_LEASE_MS = 100
MAX_LEASE_MS = 600_000
#: A warning that repeats every round (the store is down: twice a second) is logged
#: once, then at most once per this many seconds, with the count of repeats between.
WARNING_INTERVAL_S = 30.0


class RateLimitedWarning:
    """One kind of warning, logged when it starts and then at most every ``interval_s``
    (the repeats in between are counted in the next line), and one INFO line when the
    condition ends. Thread-safe."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = WARNING_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the condition started
        self._last: float = float("-inf")  # when it was last logged
        self._repeats = 0

    @property
    def active(self) -> bool:
        return self._since is not None

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            if self._since is None:
                self._since = now
            if now - self._last < self._interval_s:
                self._repeats += 1
                return
            repeats, self._repeats, self._last = self._repeats, 0, now
        if repeats:
            message += " (%d more times since the last such line)"
            args = (*args, repeats)
        self._log.warning(message, *args)

    def ended(self, message: str, *args: object) -> None:
        """The condition is over: say so (with how long it lasted) if it was logged."""
        with self._lock:
            since, self._since = self._since, None
            self._last, self._repeats = float("-inf"), 0
        if since is not None:
            self._log.info(message + " (after %.1f s)", *args, self._clock() - since)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One value of a leader row."""

    epoch: int
    holder: str
    address: str
    lease_ms: int
    renewals: int = 0
    released: bool = False
    deposed_by: str = ""
    #: The holder holds the store's exclusive claim of the role for as long as it may
    #: serve under this row: whoever holds that claim now knows the holder has stopped.
    claimed: bool = False

    def encode(self) -> bytes:
        return json.dumps(
            {
                "epoch": self.epoch,
                "holder": self.holder,
                "address": self.address,
                "lease_ms": self.lease_ms,
                "renewals": self.renewals,
                "released": self.released,
                "deposed_by": self.deposed_by,
                "claimed": self.claimed,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LeaseRecord:
        try:
            data = json.loads(raw)
            return cls(
                epoch=int(data["epoch"]),
                holder=str(data["holder"]),
                address=str(data["address"]),
                lease_ms=int(data["lease_ms"]),
                renewals=int(data.get("renewals", 0)),
                released=bool(data.get("released", False)),
                deposed_by=str(data.get("deposed_by", "")),
                claimed=bool(data.get("claimed", False)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"corrupt leader row {raw!r}") from exc

    @property
    def live(self) -> bool:
        """Held, not released or deposed: its holder may be serving."""
        return not self.released and not self.deposed_by


@dataclass(frozen=True, slots=True)
class LeaseView:
    """What one replica knows of its role's leader row, for status and metrics."""

    role: str
    replica: str
    address: str
    leading: bool
    epoch: int | None
    leader: str | None
    leader_address: str | None
    #: Seconds since this replica saw the row change (None: never read it).
    row_age_s: float | None
    #: Seconds of lease left, when leading.
    lease_left_s: float | None
    lease_ms: int


def check_lease_ms(lease_ms: int) -> int:
    if not isinstance(lease_ms, int) or isinstance(lease_ms, bool):
        raise TypeError(f"lease_ms must be int milliseconds, got {type(lease_ms).__name__}")
    if not MIN_LEASE_MS <= lease_ms <= MAX_LEASE_MS:
        raise ValueError(f"leader lease must be {MIN_LEASE_MS}..{MAX_LEASE_MS} ms, got {lease_ms}")
    return lease_ms


class LeaderLease:
    """One replica's claim on, and view of, the leader row of ``role`` on ``store``.

    :meth:`step` is one round of the protocol (read the row; renew, take over or wait);
    :meth:`start` runs it on a daemon thread, :meth:`acquire` until this replica leads.
    ``on_change(epoch)`` is called from the stepping thread when this replica starts a
    term (``epoch``) and with ``None`` when the term ends; it runs before
    :meth:`valid` turns true and after it turned false; if it raises when a term
    starts, this replica steps down (releases the row) instead of holding a term it
    cannot serve. ``on_row(record)`` is called when a read finds the row changed (a new
    leader, a release, a depose).
    """

    def __init__(
        self,
        store: KVStore,
        role: str = "tso",
        *,
        address: str = "",
        lease_ms: int = DEFAULT_LEASE_MS,
        on_change: Callable[[int | None], None] | None = None,
        on_row: Callable[[LeaseRecord | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        check_validity: bool = True,
        claim: Claim | None = None,
        claim_role: str | None = None,
    ) -> None:
        """``claim``: the store's exclusive claim of the role, held by this process for
        as long as it lives (an embedded oracle). ``claim_role``: instead, claim that
        role on the store for each term (replicas); on stores whose claims are not
        exclusive this changes nothing. ``check_validity=False`` exists only for the test
        build that shows the checks catch a leader serving without its lease; it removes
        the protection of S7."""
        self._store = store
        self.role = role
        self._key = role.encode()
        self.id = uuid.uuid4().hex
        self.address = address
        self.lease_ms = check_lease_ms(lease_ms)
        self._on_change = on_change
        self._on_row = on_row
        self._clock = clock
        self._check_validity = check_validity
        #: The store's exclusive claim of the role: the proof that a holder is gone.
        self._claims = HolderClaim(store, claim=claim, claim_role=claim_role)
        self._lock = threading.RLock()
        #: The row as last read, and when (our clock) we first saw that value.
        self._seen: bytes | None = None
        #: ``_seen`` decoded once, for the calls that ask who leads (every forwarded one).
        self._seen_record: LeaseRecord | None = None
        self._seen_at: float | None = None
        self._read_once = False
        #: Our own row while we lead, and until when our lease is valid.
        self._mine: bytes | None = None
        self._mine_epoch: int | None = None
        self._valid_until = float("-inf")
        #: A write whose compare-and-set failed without saying whether it applied.
        self._in_doubt: tuple[bytes, float] | None = None
        #: Our term ended by a depose: sit out one takeover so another replica wins.
        self._sit_out_until = float("-inf")
        #: Why the last term could not start, for :meth:`acquire` to raise.
        self._stepped_down: Exception | None = None
        #: Why this replica last stepped down from a term it could not serve (cleared
        #: when a term starts), for the error of calls that found no leader.
        self.step_down_reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The last store error of a round, cleared by a round that reached the store:
        #: why no leader can be had, for the calls that wait for one.
        self.store_error: StoreError | None = None
        #: A write of this round that could not reach the store (the round went on).
        self._write_error: StoreError | None = None
        self._store_warning = RateLimitedWarning(log)
        metrics.track_lease(self)

    @property
    def name(self) -> str:
        """This replica in logs: the address it serves on (an embedded oracle, which
        serves no address, by its id)."""
        return self.address or f"embedded-{self.id[:8]}"

    # --- what servers ask ------------------------------------------------------------

    def valid(self) -> bool:
        """Whether this replica leads and its lease has not run out by its own clock."""
        if not self._check_validity:
            return self._mine is not None
        return self._mine is not None and self._clock() < self._valid_until

    def valid_for(self, epoch: int | None) -> bool:
        """:meth:`valid`, in term ``epoch``."""
        return epoch is not None and self.valid() and self.epoch == epoch

    @property
    def epoch(self) -> int | None:
        """This replica's term while it leads."""
        return self._mine_epoch

    def leader(self) -> LeaseRecord | None:
        """The row as last read: who leads (or led) the role."""
        return self._seen_record

    def seen_epoch(self) -> int | None:
        """The epoch of the row as last read (None: absent, or never read)."""
        record = self._seen_record
        return None if record is None else record.epoch

    def row_age_s(self) -> float | None:
        """Seconds since this replica saw the row change (None: never read it)."""
        seen_at = self._seen_at
        return None if seen_at is None else max(0.0, self._clock() - seen_at)

    @property
    def stopped(self) -> bool:
        """Released: this replica takes no part in the election any more."""
        return self._stop.is_set()

    def leader_address(self) -> str | None:
        """Where the live leader serves, as far as this replica last read."""
        record = self.leader()
        if record is None or not record.live or not record.address:
            return None
        return record.address

    def view(self) -> LeaseView:
        now = self._clock()
        record = self.leader()
        leading = self.valid()
        return LeaseView(
            role=self.role,
            replica=self.id,
            address=self.address,
            leading=leading,
            epoch=None if record is None else record.epoch,
            leader=None if record is None or not record.live else record.holder,
            leader_address=self.leader_address(),
            row_age_s=None if self._seen_at is None else now - self._seen_at,
            lease_left_s=max(0.0, self._valid_until - now) if leading else None,
            lease_ms=self.lease_ms,
        )

    # --- the protocol ----------------------------------------------------------------

    def step(self) -> None:
        """One round: read the row, then renew our lease, or take it over, or wait."""
        with self._lock:
            raw = self._store.get_system(LEADER_TABLE, [self._key]).get(self._key)
            now = self._clock()
            if not self._read_once or raw != self._seen:
                self._saw(raw, now)
            if self._in_doubt is not None:
                attempted, sent_at = self._in_doubt
                self._in_doubt = None
                if raw == attempted:  # our write applied after all
                    self._became(attempted, sent_at)
            if self._mine is not None:
                if raw != self._mine:
                    self._end_term("the leader row changed: " + _describe(raw))
                else:
                    self._renew(raw)
                    return
            self._maybe_take_over(raw, now)

    def _saw(self, raw: bytes | None, at: float) -> None:
        """The row holds ``raw`` (read, or written by us), first seen at ``at``."""
        changed = not self._read_once or raw != self._seen
        record = (
            self._seen_record if not changed else None if raw is None else LeaseRecord.decode(raw)
        )
        if changed:
            _log_leader(self, self._seen_record if self._read_once else None, record)
            previous = self._seen_record
            if record is not None and (previous is None or previous.epoch != record.epoch):
                metrics.record_leader_seen()
        self._seen, self._seen_record, self._seen_at, self._read_once = raw, record, at, True
        if changed and self._on_row is not None:
            # Our own takeover too: calls we forwarded to the old leader are cancelled.
            self._on_row(record)

    def _renew(self, current: bytes) -> None:
        record = LeaseRecord.decode(current)
        # A term that began without the claim (another process held it) marks its row
        # claimed once it gets it, so that its own crash is not waited out.
        claimed = record.claimed or self._claims.now() is not None
        new = replace(
            record, renewals=record.renewals + 1, lease_ms=self.lease_ms, claimed=claimed
        ).encode()
        self._write(current, new)

    def _maybe_take_over(self, raw: bytes | None, now: float) -> None:
        record = None if raw is None else LeaseRecord.decode(raw)
        if now < self._sit_out_until:
            return
        if record is not None and not record.released:
            assert self._seen_at is not None
            # Wait out the lease the old holder asked for, by our clock, from when we
            # first saw its last renewal (or the depose), unless the claim proves the
            # holder gone.
            due = now - self._seen_at >= record.lease_ms / 1000 * (1 + DRIFT_MARGIN)
            if not due and not self._claims.proves_gone(record):
                self._claims.drop_term_claim()
                return
        epoch = 1 if record is None else record.epoch + 1
        claimed = self._claims.now() is not None
        new = LeaseRecord(epoch, self.id, self.address, self.lease_ms, claimed=claimed).encode()
        self._write(raw, new)
        if self._mine is None and self._in_doubt is None:
            self._claims.drop_term_claim()  # lost the race: the claim is not ours to keep

    def _write(self, expected: bytes | None, new: bytes) -> None:
        sent_at = self._clock()
        try:
            result = self._store.compare_and_set(LEADER_TABLE, self._key, expected, new)
        except StoreError as exc:
            # It may have applied: settled on the next read. Until then a lease we
            # held runs out by itself.
            self._write_error = exc
            self._store_warning.warning(
                "%s: leader row write for %s failed: %s", self.name, self.role, exc
            )
            self._in_doubt = (new, sent_at)
            return
        if result.applied:
            self._saw(new, sent_at)
            self._became(new, sent_at)
        else:
            self._saw(result.current, self._clock())
            if self._mine is not None:
                self._end_term("lost the leader row: " + _describe(result.current))

    def _became(self, mine: bytes, sent_at: float) -> None:
        starting = self._mine is None
        self._mine = mine
        if starting:
            epoch = self._mine_epoch = LeaseRecord.decode(mine).epoch
            log.info("%s leads %s from epoch %d", self.name, self.role, epoch)
            if self._on_change is not None:
                try:
                    self._on_change(epoch)
                except Exception as exc:
                    self._step_down(mine, f"cannot serve epoch {epoch}: {exc}")
                    self._stepped_down = exc
                    return
            self.step_down_reason = None
        self._valid_until = sent_at + self.lease_ms / 1000 * (1 - DRIFT_MARGIN)

    def _step_down(self, mine: bytes, why: str) -> None:
        """Give up a term that could not start: it served nothing, so the row is
        released for whoever can serve, and this replica sits out one takeover (alone,
        it tries again after that)."""
        log.error("%s steps down from %s: %s", self.name, self.role, why)
        self.step_down_reason = why
        self._valid_until = float("-inf")
        self._mine = self._mine_epoch = None
        self._sit_out_until = self._clock() + self.lease_ms / 1000 * (1 + DRIFT_MARGIN)
        released = replace(LeaseRecord.decode(mine), released=True).encode()
        try:
            result = self._store.compare_and_set(LEADER_TABLE, self._key, mine, released)
        except StoreError as exc:
            # Not released: the others wait out the lease, as after a crash.
            log.warning("could not release the %s row after stepping down: %s", self.role, exc)
        else:
            if result.applied:
                self._saw(released, self._clock())
        self._claims.drop_term_claim()

    def _end_term(self, why: str) -> None:
        if self._mine is None:
            return
        epoch = LeaseRecord.decode(self._mine).epoch
        self._valid_until = float("-inf")
        self._mine = self._mine_epoch = None
        # A release is the clean end of a term (a graceful stop): no warning.
        log.log(
            logging.INFO if why == "released" else logging.WARNING,
            "%s stops leading %s (epoch %d): %s",
            self.name,
            self.role,
            epoch,
            why,
        )
        record = self.leader()
        if record is not None and record.deposed_by:
            self._sit_out_until = self._clock() + 2 * self.lease_ms / 1000 * (1 + DRIFT_MARGIN)
        if self._on_change is not None:
            self._on_change(None)
        # Only now, with nothing served under the old row any more, may another
        # process take the claim as proof that this holder is gone.
        self._claims.drop_term_claim()

    def depose(self, why: str) -> bool:
        """Mark the live leader deposed (it cannot be reached); whether the row changed."""
        with self._lock:
            raw = self._seen
            record = self.leader()
            if raw is None or record is None or not record.live or record.holder == self.id:
                return False
            new = replace(record, deposed_by=self.id).encode()
            try:
                result = self._store.compare_and_set(LEADER_TABLE, self._key, raw, new)
            except StoreError as exc:
                log.warning("could not depose the %s leader: %s", self.role, exc)
                return False
            now = self._clock()
            if result.applied:
                log.warning(
                    "%s deposed %s leader %s (epoch %d): %s",
                    self.name,
                    self.role,
                    record.address or record.holder[:8],
                    record.epoch,
                    why,
                )
                self._saw(new, now)
                return True
            self._saw(result.current, now)
            return False

    # --- running it ----------------------------------------------------------------

    @property
    def interval_s(self) -> float:
        """How often the stepping thread runs: renewals every quarter lease, reads of a
        follower every eighth."""
        return self.lease_ms / 1000 / (4 if self._mine is not None else 8)

    def start(self) -> None:
        """Step on a daemon thread until :meth:`release` (or until nothing refers to this
        lease any more: a manager dropped without closing does not leave it running)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=_run,
            args=(weakref.ref(self), self._stop, self.role),
            name=f"percolake-lease-{self.role}",
            daemon=True,
        )
        self._thread.start()

    def _round(self) -> bool:
        """One round of the stepping thread; whether to go on."""
        self._write_error = None
        try:
            self.step()
        except StoreError as exc:
            self.store_error = exc
            self._store_warning.warning(
                "%s: leader lease of %s: store unreachable: %s", self.name, self.role, exc
            )
            return True
        except ValueError as exc:  # the store was closed under us: nothing to lead
            log.info("leader lease of %s stops: %s", self.role, exc)
            with self._lock:
                self._end_term(str(exc))
            return False
        except Exception:
            log.exception("leader lease of %s: step failed", self.role)
            return True
        if self._write_error is not None:
            self.store_error = self._write_error
            return True
        self.store_error = None
        self._store_warning.ended(
            "%s: leader lease of %s: store reachable again", self.name, self.role
        )
        return True

    def acquire(self, timeout_s: float) -> bool:
        """Step until this replica leads or ``timeout_s`` passed; whether it leads.

        Raises what ``on_change`` raised if a term could not start (it stepped down)."""
        deadline = self._clock() + timeout_s
        self._stepped_down = None
        while True:
            self.step()
            if self._stepped_down is not None:  # a term we could not serve
                raise self._stepped_down
            if self.valid():
                return True
            if self._clock() >= deadline:
                return False
            time.sleep(min(self.interval_s, max(0.0, deadline - self._clock())))

    def release(self) -> None:
        """Stop stepping; if leading, stop serving and hand the row over. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock:
            mine = self._mine
            if mine is None:
                return
            self._end_term("released")
            released = replace(LeaseRecord.decode(mine), released=True).encode()
            try:
                self._store.compare_and_set(LEADER_TABLE, self._key, mine, released)
            except StoreError as exc:
                log.warning("could not release the %s lease (it runs out): %s", self.role, exc)


def _run(ref: weakref.ref[LeaderLease], stop: threading.Event, role: str) -> None:
    while not stop.is_set():
        lease = ref()
        if lease is None or not lease._round():
            return
        interval = lease.interval_s
        del lease  # hold no reference while waiting
        stop.wait(interval)


def _describe(raw: bytes | None) -> str:
    if raw is None:
        return "absent"
    record = LeaseRecord.decode(raw)
    state = "released" if record.released else ("deposed" if record.deposed_by else "held")
    return f"epoch {record.epoch}, {state} by {record.holder[:8]}"


def _log_leader(lease: LeaderLease, old: LeaseRecord | None, new: LeaseRecord | None) -> None:
    """Every replica logs each change of who leads (not the renewals), by address."""
    if new is None or (
        old is not None and (old.epoch, old.holder, old.live) == (new.epoch, new.holder, new.live)
    ):
        return
    who = new.address or f"an embedded oracle ({new.holder[:8]}, serving its own process)"
    if new.holder == lease.id:
        who += " (this replica)"
    if new.released:
        log.info("%s: %s leader %s released epoch %d", lease.name, lease.role, who, new.epoch)
    elif new.deposed_by:
        log.info("%s: %s leader %s of epoch %d was deposed", lease.name, lease.role, who, new.epoch)
    else:
        log.info("%s: %s leader is now %s, epoch %d", lease.name, lease.role, who, new.epoch)
