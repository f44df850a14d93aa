"""An in-memory table of exclusive, leased locks on byte-string descriptors.

Locks exist for liveness only (rule S5): the transaction protocol stays correct
when any lock is lost. So the table is deliberately simple and in memory; a
restart loses every lock and changes the epoch, and tokens of an older epoch are
rejected so that no client believes it still holds a lock it lost. A table that
served one term of a replicated control plane is closed when the term ends
(:meth:`LockTable.close`): its grants end with it, and calls still waiting in it fail
instead of being granted after the term.

The table is also the queue that pessimistic transactions wait in: locks of one owner
are reentrant, and a wait that would close a cycle of owners waiting for each other is
refused with :class:`~wire.errors.DeadlockError` instead of waiting until its timeout.
A lock call may carry a priority (a transaction's start timestamp): waiters then queue
oldest first instead of in arrival order, which is the order in which their writes can
still commit (docs/design/protocol.md, "Pessimistic reads").
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from lockserver._waits import Edge, Grant, LockWait, ReleaseWatchers, Slot, WaitForGraph
from wire import metrics
from wire.errors import DeadlockError, ServiceUnavailableError, StaleTokenError

log = logging.getLogger(__name__)

#: Upper bound on a lease: a lease is a promise that the holder is alive, and one
#: longer than this means a dead client blocks others for too long.
MAX_LEASE_MS = 10 * 60 * 1000
MAX_DESCRIPTOR_BYTES = 4096
#: How many waits :meth:`LockTable.waits` returns unless asked otherwise.
DEFAULT_WAITS_LIMIT = 10
#: Descriptors and owners are cut to this many characters in messages and status.
_RENDERED_CHARS = 48


class LockToken(NamedTuple):
    """Proof of holding a batch of locks: valid only in the epoch that issued it."""

    epoch: int
    lock_id: int


class LockTableClosedError(ServiceUnavailableError):
    """This lock table was closed (its term of the control plane ended): it grants,
    refreshes and releases nothing more. The caller asks whoever serves locks now."""


def render_descriptor(descriptor: bytes) -> str:
    """A descriptor as readable text for messages and ``percolake status``: printable
    ASCII as is, other bytes escaped, cut to a few dozen characters."""
    text = repr(descriptor)[2:-1]
    return _cut(text, f"… ({len(descriptor)} bytes)")


def _cut(text: str, suffix: str = "…") -> str:
    return text if len(text) <= _RENDERED_CHARS else text[:_RENDERED_CHARS] + suffix


def _describe(cycle: list[Edge]) -> str:
    """A deadlock's cycle as text for its error and the log: who waits for whom, on what."""
    return "; ".join(
        f"{_cut(waiter)} waits for {_cut(holder)} on '{render_descriptor(d)}'"
        for waiter, d, holder in cycle
    )


def _check_descriptors(descriptors: Iterable[bytes]) -> tuple[bytes, ...]:
    if isinstance(descriptors, bytes | str):
        raise TypeError("descriptors must be an iterable of bytes, not a single value")
    out = set()
    for d in descriptors:
        if not isinstance(d, bytes):
            raise TypeError(f"lock descriptor must be bytes, got {type(d).__name__}")
        if not d:
            raise ValueError("lock descriptor must not be empty")
        if len(d) > MAX_DESCRIPTOR_BYTES:
            raise ValueError(f"lock descriptor longer than {MAX_DESCRIPTOR_BYTES} bytes")
        out.add(d)
    if not out:
        raise ValueError("at least one lock descriptor is required")
    return tuple(sorted(out))


def _check_ms(name: str, value: object, *, upper: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be int milliseconds, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    if upper is not None and value > upper:
        raise ValueError(f"{name} must be at most {upper}, got {value}")
    return value


def _check_lock_args(
    owner: str, lease_ms: int, wait_timeout_ms: int, priority: int | None
) -> tuple[int, int]:
    """The arguments of :meth:`LockTable.lock` besides its descriptors, checked: the
    lease and the wait in milliseconds."""
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool) or priority < 0
    ):
        raise ValueError(f"priority must be a non-negative int or None, got {priority!r}")
    if not isinstance(owner, str) or not owner:
        raise ValueError("owner must be a non-empty str")
    lease = _check_ms("lease_ms", lease_ms, upper=MAX_LEASE_MS)
    if lease == 0:
        raise ValueError("lease_ms must be positive")
    return lease, _check_ms("wait_timeout_ms", wait_timeout_ms)


class LockTable:
    """Exclusive locks with owners, leases, FIFO waiting and an epoch.

    A batch is acquired all-or-nothing, descriptor by descriptor in sorted order,
    so two batches can never wait for each other in a cycle. Each descriptor
    serves waiters first-come first-served, except that a call with a priority goes
    ahead of the prioritized calls with a larger one queued after the last call without
    a priority (:meth:`Slot.enqueue` says why neither kind starves). Transactions pass
    their start timestamp: a pessimistic transaction cannot write a cell that one which
    began after it committed first, so the oldest waiter should be granted first. A
    holder whose lease ran out is
    treated as gone: the next waiter takes the lock, and the old token no longer
    refreshes or releases anything.

    Locks are reentrant per owner: a descriptor held by a live grant of owner O is
    granted at once to another call of O, ahead of the queue (O would otherwise wait
    behind a waiter that waits for O), and stays held until every grant of O holding it
    is released or expired. Tokens stay per grant. A transaction that locks cells one
    by one (``get_for_update``), then its whole commit batch, relies on this.

    Cycles come only from such incremental grants of one owner. A call about to wait
    (and a woken one, when the graph gained an edge no new wait added) follows the
    wait-for graph between owners: its owner waits for the owner holding the descriptor
    and for the owners queued ahead of its owner's first call in that queue (in the
    queue's order, priorities included; a call that goes ahead of others also checks
    the cycles through the edges its arrival added into its owner). If that
    leads back to its own owner, the call is the victim: it releases what it acquired
    so far (not its owner's other grants) and raises
    :class:`~wire.errors.DeadlockError` naming the cycle. The check runs under the
    table's mutex, where the cycle closes, so each cycle has exactly one victim.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.epoch = secrets.randbits(63)
        #: Guards all state. Nobody waits on the table as a whole: each waiting call
        #: sleeps on a condition of its own and is woken only when something it waits for
        #: changes (see ``_wake_slot``), so a release does not wake every waiter of every
        #: descriptor to find them all still blocked, a herd that with dozens of waiters
        #: on a few hot keys cost each grant dozens of wake-ups.
        self._mutex = threading.RLock()
        #: Conditions of the ``wait_until_released`` calls, by the descriptors they watch.
        self._watchers = ReleaseWatchers()
        #: Notifications sent to waiting lock calls so far (tests check who is woken).
        self._notified = 0
        self._slots: dict[bytes, Slot] = {}
        self._grants: dict[int, Grant] = {}
        self._ids = itertools.count(1)
        self._closed = False
        #: The calls waiting now, and whom they wait for (read for deadlocks and ``waits``).
        self._graph = WaitForGraph(self._slots, clock)
        #: Changes that add edges to the wait-for graph other than a wait beginning: a
        #: call of an owner leaves a queue (or a holding) while a later call of that
        #: owner stays in the queue, which then waits for those it stood behind. A call
        #: checks for a cycle when it begins to wait (a cycle its wait closes is found
        #: then, by it), and once woken only when this count changed since: a cycle
        #: can close in no other way, and a check on every wake-up of every waiter
        #: would cost each release the square of the waiters. A change wakes every
        #: waiting call (``_graph_changed``); nothing else wakes a call it cannot help.
        self._graph_changes = 0
        metrics.track_locks_held(self.__len__)
        metrics.track_lock_waiters(self.waiter_count)

    def close(self) -> None:
        """End every grant and refuse every call from now on; calls waiting in the
        table wake up and raise :class:`LockTableClosedError`. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            for grant in self._graph.grants():
                self._notify(grant)
            self._watchers.notify_all()
            self._grants.clear()
            self._slots.clear()
            self._graph.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        """The caller holds the mutex."""
        if self._closed:
            raise LockTableClosedError(
                f"lock table of epoch {self.epoch} was closed: its term ended"
            )

    # --- acquiring ---------------------------------------------------------------

    def lock(
        self,
        descriptors: Iterable[bytes],
        owner: str,
        lease_ms: int,
        wait_timeout_ms: int = 0,
        priority: int | None = None,
    ) -> LockToken | None:
        """Lock every descriptor or none. Returns a token, or ``None`` on timeout.

        ``priority`` orders the wait (lower first; transactions pass their start
        timestamp so that the oldest waiter is granted first); calls without one, or with
        equal ones, wait in arrival order (see :class:`LockTable`).

        Raises :class:`~wire.errors.DeadlockError` when waiting would close a cycle of
        owners waiting for each other; the call then holds nothing."""
        wanted = _check_descriptors(descriptors)
        lease, wait = _check_lock_args(owner, lease_ms, wait_timeout_ms, priority)
        with self._mutex:
            self._check_open()
            now = self._clock()
            deadline = now + wait / 1000
            grant = Grant(
                LockToken(self.epoch, next(self._ids)),
                owner,
                wanted,
                lease,
                # Held partial locks must not expire while the batch is still waiting.
                expires_at=deadline + lease / 1000,
                priority=priority,
            )
            self._grants[grant.token.lock_id] = grant
            for descriptor in wanted:
                slot = self._slots.setdefault(descriptor, Slot())
                # Queued even when it need not wait: a slot with a queue is never
                # unlinked, not even when an expired holder is dropped on the way.
                passed = slot.enqueue(grant)
                if not self._can_take(slot, grant) and not self._wait_for(
                    slot, descriptor, grant, deadline, passed
                ):
                    return None
                slot.dequeue(grant)
                slot.holders.append(grant)
                # Its owner's later calls here are granted now by reentry: wake them.
                self._wake_slot(slot)
                grant.acquired += 1
            grant.expires_at = self._clock() + lease / 1000
            metrics.record_lock_wait(grant.wait_started)
            return grant.token

    def _wait_for(
        self, slot: Slot, descriptor: bytes, grant: Grant, deadline: float, passed: bool
    ) -> bool:
        """Wait in the queue (``grant`` stands in it) until ``grant`` may take
        ``descriptor``: ``True`` then, ``False`` on timeout or when its partial locks
        were lost (it is out of the queue and holds nothing). Raises on deadlock and
        when the table closes. ``passed``: ``grant`` went ahead of another owner's call
        (its priority), so that owner now waits for ``grant``'s owner too."""
        if deadline <= self._clock():
            # No wait allowed (or its time is up): a try is neither a waiter nor a
            # deadlock victim, as it never waits.
            self._give_up(slot, descriptor, grant)
            return False
        # Its thread sleeps on a condition of its own, notified by ``_notify``.
        self._graph.begin(grant, descriptor, threading.Condition(self._mutex))
        try:
            while not self._can_take(slot, grant):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    self._give_up(slot, descriptor, grant)
                    return False
                if grant.checked_at != self._graph_changes:
                    self._check_deadlock(slot, descriptor, grant, passed)
                    passed = False
                if grant.wait_started is None:
                    grant.wait_started = time.monotonic()
                assert grant.wakeup is not None
                grant.wakeup.wait(min(remaining, slot.time_to_expiry(self._clock)))
                # Closed while waiting: the term ended, nothing may be granted in it.
                self._check_open()
                if grant.token.lock_id not in self._grants:
                    # Its partial locks expired while it waited (its thread woke late):
                    # what it held is gone, so it cannot be granted all or nothing.
                    self._give_up(slot, descriptor, grant)
                    return False
        finally:
            self._graph.end(grant)
        return True

    def _give_up(self, slot: Slot, descriptor: bytes, grant: Grant) -> None:
        self._leave(slot, descriptor, grant)
        if grant.wait_started is not None:  # it waited, here or for an earlier descriptor
            metrics.record_lock_wait(grant.wait_started)
            metrics.record_lock_wait_timeout()

    def _can_take(self, slot: Slot, grant: Grant) -> bool:
        """Whether ``grant`` may hold the slot now: its owner holds it already (reentry,
        ahead of the queue), or it is free and ``grant`` is first in line."""
        now = self._clock()
        for holder in [h for h in slot.holders if h.expires_at <= now]:
            log.debug("lease of %s (%s) expired", holder.token, holder.owner)
            self._drop(holder)
        if slot.holders:
            return slot.holders[0].owner == grant.owner
        return slot.queue[0] is grant

    def _leave(self, slot: Slot, descriptor: bytes, grant: Grant) -> None:
        """``grant`` gives up waiting: out of the queue, and everything it holds freed."""
        slot.dequeue(grant)
        if grant.owner in slot.queued:
            self._graph_changed()
        if not slot.holders and not slot.queue and self._slots.get(descriptor) is slot:
            del self._slots[descriptor]
        else:
            self._wake_slot(slot)  # it may have stood first in line: the next one may take
        self._drop(grant)

    def _drop(self, grant: Grant) -> None:
        """Release everything ``grant`` holds; the caller holds the mutex."""
        self._grants.pop(grant.token.lock_id, None)
        for descriptor in grant.descriptors[: grant.acquired]:
            slot = self._slots.get(descriptor)
            if slot is not None and grant in slot.holders:
                slot.holders.remove(grant)
                if not slot.holders and not slot.queue:
                    del self._slots[descriptor]
                else:
                    if not slot.holders and grant.owner in slot.queued:
                        self._graph_changed()
                    self._wake_slot(slot)
                self._watchers.notify(descriptor)
        grant.acquired = 0
        if grant.waiting_on is not None:
            # Dropped while it waits (its partial locks expired): it gives up when woken.
            self._notify(grant)

    # --- waking ------------------------------------------------------------------

    def _notify(self, grant: Grant) -> None:
        """Wake ``grant``'s thread if it sleeps in a wait; the caller holds the mutex."""
        if grant.wakeup is not None:
            grant.wakeup.notify()
            self._notified += 1

    def _wake_slot(self, slot: Slot) -> None:
        """Wake the calls queued on ``slot`` that may take it now (``Slot.takers``), after
        its holders or its queue changed. The others stay asleep: they could not take it,
        and their deadlock checks are due only when the graph changes (``_graph_changed``)."""
        for grant in slot.takers():
            self._notify(grant)

    def _graph_changed(self) -> None:
        """The wait-for graph gained an edge no new wait added (see ``_graph_changes``):
        every waiting call wakes and checks for a cycle again, as a cycle may now run
        through any of them."""
        self._graph_changes += 1
        for grant in self._graph.grants():
            self._notify(grant)

    # --- deadlocks -----------------------------------------------------------------

    def _check_deadlock(
        self, slot: Slot, descriptor: bytes, grant: Grant, passed: bool = False
    ) -> None:
        """Raise :class:`DeadlockError` if ``grant``'s wait closes a cycle, after giving up
        the wait and what it holds so that the others of the cycle proceed. Giving up
        takes back every edge its arrival added (``passed``: also those into its owner
        from the calls it went ahead of), so the graph is left without the cycle."""
        grant.checked_at = self._graph_changes
        cycle = self._graph.find_cycle(grant, passed)
        if cycle is None:
            return
        text = _describe(cycle)
        self._leave(slot, descriptor, grant)
        metrics.record_lock_wait(grant.wait_started)
        metrics.record_lock_deadlock()
        log.warning("deadlock in lock epoch %d: %s; victim %s", self.epoch, text, grant.owner)
        raise DeadlockError(
            f"deadlock: {text}; {_cut(grant.owner)} gives up its wait, "
            "releases this call's locks and aborts"
        )

    # --- holding -----------------------------------------------------------------

    def _live_grant(self, token: LockToken) -> Grant | None:
        if not isinstance(token, LockToken):
            raise TypeError(f"expected LockToken, got {type(token).__name__}")
        if token.epoch != self.epoch:
            raise StaleTokenError(
                f"lock token from epoch {token.epoch}, server is at epoch {self.epoch}"
            )
        self._check_open()
        grant = self._grants.get(token.lock_id)
        if grant is None:
            return None
        if grant.expires_at <= self._clock():
            self._drop(grant)
            return None
        return grant

    def refresh(self, token: LockToken, lease_ms: int | None = None) -> bool:
        """Extend the lease; ``False`` when the locks were already lost."""
        if lease_ms is not None:
            _check_ms("lease_ms", lease_ms, upper=MAX_LEASE_MS)
        with self._mutex:
            grant = self._live_grant(token)
            if grant is None:
                return False
            if lease_ms is not None:
                grant.lease_ms = lease_ms
            grant.expires_at = self._clock() + grant.lease_ms / 1000
            return True

    def unlock(self, token: LockToken) -> bool:
        """Release the batch; ``False`` when it was already lost (expired or released).

        A descriptor its owner also holds through another grant stays held by that one."""
        with self._mutex:
            grant = self._live_grant(token)
            if grant is None:
                return False
            self._drop(grant)
            return True

    # --- observing ---------------------------------------------------------------

    def holder(self, descriptor: bytes) -> str | None:
        """The owner currently holding ``descriptor`` under a live lease."""
        (d,) = _check_descriptors([descriptor])
        with self._mutex:
            self._check_open()
            slot = self._slots.get(d)
            if slot is None or self._expire_if_due(slot):
                return None
            return slot.holders[0].owner

    def wait_until_released(self, descriptors: Iterable[bytes], timeout_ms: int) -> bool:
        """Wait until no live lease holds any of ``descriptors``; ``False`` on timeout.

        Readers use this to wait on a writer that is committing instead of aborting it.
        Waiting does not queue: a reader never delays a writer.
        """
        wanted = _check_descriptors(descriptors)
        wait = _check_ms("timeout_ms", timeout_ms)
        with self._mutex:
            self._check_open()
            deadline = self._clock() + wait / 1000
            # Woken when a holder of one of them is released or dropped, or on close.
            wakeup = threading.Condition(self._mutex)
            with self._watchers.watching(wanted, wakeup):
                while True:
                    self._check_open()
                    busy = [s for d in wanted if (s := self._slots.get(d)) and s.holders]
                    live = [s for s in busy if not self._expire_if_due(s)]
                    if not live:
                        return True
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        return False
                    wakeup.wait(min([remaining] + [s.time_to_expiry(self._clock) for s in live]))

    def _expire_if_due(self, slot: Slot) -> bool:
        """Drop the slot's holders whose lease ran out; ``True`` when none is left."""
        now = self._clock()
        for holder in [h for h in slot.holders if h.expires_at <= now]:
            self._drop(holder)
        return not slot.holders

    def waits(self, limit: int = DEFAULT_WAITS_LIMIT) -> list[LockWait]:
        """The ``limit`` longest waits now, longest first: who waits, for which
        descriptor, since when, and behind whom (for ``percolake status``)."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"limit must be a non-negative int, got {limit!r}")
        with self._mutex:
            if self._closed:
                return []
            return self._graph.waits(self._clock())[:limit]

    def waiter_count(self) -> int:
        """How many lock calls wait in the table now (the ``percolake_lock_waiters``
        gauge)."""
        return self._graph.count

    def __len__(self) -> int:
        """How many lock batches are currently granted (live or not yet reaped)."""
        with self._mutex:
            return len(self._grants)
