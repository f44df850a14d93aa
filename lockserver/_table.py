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
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

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


class LockWait(NamedTuple):
    """A lock call waiting now, as :meth:`LockTable.waits` reports it."""

    owner: str
    descriptor: bytes  # the descriptor it waits for now
    waited_s: float  # since the call began to wait (on this or an earlier descriptor)
    waits_for: str | None  # the owner it waits behind: the holder, else the queue ahead


class LockTableClosedError(ServiceUnavailableError):
    """This lock table was closed (its term of the control plane ended): it grants,
    refreshes and releases nothing more. The caller asks whoever serves locks now."""


@dataclass(slots=True, eq=False)  # compared by identity: queues hold and remove them
class _Grant:
    token: LockToken
    owner: str
    descriptors: tuple[bytes, ...]
    lease_ms: int
    expires_at: float
    acquired: int = 0  # descriptors acquired so far, in sorted order
    #: Lower goes first among the prioritized waiters queued since the last unprioritized
    #: one; ``None``: in arrival order, and no later call passes it (see ``_Slot.enqueue``).
    priority: int | None = None
    waiting_on: bytes | None = None  # the descriptor whose queue it stands in
    waiting_since: float | None = None  # table clock, when the call first waited
    checked_at: int = -1  # the table's graph changes at its last deadlock check
    wait_started: float | None = None  # time.monotonic(), when it first waited (metrics)
    #: What its thread sleeps on while it waits (on the table's mutex); ``None`` otherwise.
    wakeup: threading.Condition | None = None


@dataclass(slots=True)
class _Slot:
    #: Live grants holding the descriptor: one, or several of one owner (reentrancy).
    holders: list[_Grant] = field(default_factory=list)
    queue: deque[_Grant] = field(default_factory=deque)
    #: How many grants of each owner stand in the queue (for the wait-for graph).
    queued: dict[str, int] = field(default_factory=dict)

    def enqueue(self, grant: _Grant) -> bool:
        """Put ``grant`` in line; ``True`` when it went ahead of a call of another owner.

        A call with a priority goes ahead of the prioritized calls with a larger priority
        queued after the last call without one; every other call (equal priority, no
        priority) goes to the back. So a call without priority is never passed by a later
        call, and a prioritized one only by a lower priority: with start timestamps as
        priorities, only by a transaction that began before it, of which there are
        finitely many (new ones always start later). Neither kind can starve.
        """
        position = len(self.queue)
        if grant.priority is not None:
            while position:
                ahead = self.queue[position - 1].priority
                if ahead is None or ahead <= grant.priority:
                    break
                position -= 1
        passed = any(self.queue[i].owner != grant.owner for i in range(position, len(self.queue)))
        self.queue.insert(position, grant)
        self.queued[grant.owner] = self.queued.get(grant.owner, 0) + 1
        return passed

    def dequeue(self, grant: _Grant) -> None:
        # Usually at the head; a reentrant grant leaves from wherever it stood.
        if self.queue and self.queue[0] is grant:
            self.queue.popleft()
        elif grant in self.queue:
            self.queue.remove(grant)
        else:
            return
        left = self.queued[grant.owner] - 1
        if left:
            self.queued[grant.owner] = left
        else:
            del self.queued[grant.owner]

    def first_of_owner(self, grant: _Grant) -> int:
        """Where the first grant of ``grant``'s owner stands in the queue (it stands in
        it): a call behind one of its own owner's is granted with that one (reentry),
        so it waits only for what stands ahead of that one."""
        position = self.queue.index(grant)
        if self.queued[grant.owner] > 1:
            for ahead in range(position):
                if self.queue[ahead].owner == grant.owner:
                    return ahead
        return position


def render_descriptor(descriptor: bytes) -> str:
    """A descriptor as readable text for messages and ``percolake status``: printable
    ASCII as is, other bytes escaped, cut to a few dozen characters."""
    text = repr(descriptor)[2:-1]
    return _cut(text, f"… ({len(descriptor)} bytes)")


def _cut(text: str, suffix: str = "…") -> str:
    return text if len(text) <= _RENDERED_CHARS else text[:_RENDERED_CHARS] + suffix


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


class LockTable:
    """Exclusive locks with owners, leases, FIFO waiting and an epoch.

    A batch is acquired all-or-nothing, descriptor by descriptor in sorted order,
    so two batches can never wait for each other in a cycle. Each descriptor
    serves waiters first-come first-served, except that a call with a priority goes
    ahead of the prioritized calls with a larger one queued after the last call without
    a priority (:meth:`_Slot.enqueue` says why neither kind starves). Transactions pass
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
        self._watchers: dict[bytes, list[threading.Condition]] = {}
        #: Notifications sent to waiting lock calls so far (tests check who is woken).
        self._notified = 0
        self._slots: dict[bytes, _Slot] = {}
        self._grants: dict[int, _Grant] = {}
        self._ids = itertools.count(1)
        self._closed = False
        #: Waiting grants by owner: the nodes of the wait-for graph.
        self._waiting: dict[str, list[_Grant]] = {}
        self._waiter_count = 0
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
            for grants in self._waiting.values():
                for grant in grants:
                    self._notify(grant)
            for watchers in self._watchers.values():
                for watcher in watchers:
                    watcher.notify()
            self._grants.clear()
            self._slots.clear()
            self._waiting.clear()
            self._waiter_count = 0

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
        if priority is not None and (
            not isinstance(priority, int) or isinstance(priority, bool) or priority < 0
        ):
            raise ValueError(f"priority must be a non-negative int or None, got {priority!r}")
        if not isinstance(owner, str) or not owner:
            raise ValueError("owner must be a non-empty str")
        lease = _check_ms("lease_ms", lease_ms, upper=MAX_LEASE_MS)
        if lease == 0:
            raise ValueError("lease_ms must be positive")
        wait = _check_ms("wait_timeout_ms", wait_timeout_ms)
        with self._mutex:
            self._check_open()
            now = self._clock()
            deadline = now + wait / 1000
            grant = _Grant(
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
                slot = self._slots.setdefault(descriptor, _Slot())
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
        self, slot: _Slot, descriptor: bytes, grant: _Grant, deadline: float, passed: bool
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
        self._begin_wait(grant, descriptor)
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
                grant.wakeup.wait(min(remaining, self._time_to_expiry(slot)))
                # Closed while waiting: the term ended, nothing may be granted in it.
                self._check_open()
                if grant.token.lock_id not in self._grants:
                    # Its partial locks expired while it waited (its thread woke late):
                    # what it held is gone, so it cannot be granted all or nothing.
                    self._give_up(slot, descriptor, grant)
                    return False
        finally:
            self._end_wait(grant)
        return True

    def _give_up(self, slot: _Slot, descriptor: bytes, grant: _Grant) -> None:
        self._leave(slot, descriptor, grant)
        if grant.wait_started is not None:  # it waited, here or for an earlier descriptor
            metrics.record_lock_wait(grant.wait_started)
            metrics.record_lock_wait_timeout()

    def _can_take(self, slot: _Slot, grant: _Grant) -> bool:
        """Whether ``grant`` may hold the slot now: its owner holds it already (reentry,
        ahead of the queue), or it is free and ``grant`` is first in line."""
        now = self._clock()
        for holder in [h for h in slot.holders if h.expires_at <= now]:
            log.debug("lease of %s (%s) expired", holder.token, holder.owner)
            self._drop(holder)
        if slot.holders:
            return slot.holders[0].owner == grant.owner
        return slot.queue[0] is grant

    def _time_to_expiry(self, slot: _Slot) -> float:
        if not slot.holders:
            return 0.05
        return max(min(h.expires_at for h in slot.holders) - self._clock(), 0.001)

    def _begin_wait(self, grant: _Grant, descriptor: bytes) -> None:
        grant.waiting_on = descriptor
        grant.checked_at = -1  # a new wait: checked before it sleeps
        grant.wakeup = threading.Condition(self._mutex)  # notified by ``_notify``
        if grant.waiting_since is None:
            grant.waiting_since = self._clock()
        self._waiting.setdefault(grant.owner, []).append(grant)
        self._waiter_count += 1

    def _end_wait(self, grant: _Grant) -> None:
        grant.waiting_on = None
        grant.wakeup = None
        mine = self._waiting.get(grant.owner)
        if mine is None or grant not in mine:
            return  # the table was closed: its graph is gone already
        mine.remove(grant)
        if not mine:
            del self._waiting[grant.owner]
        self._waiter_count -= 1

    def _leave(self, slot: _Slot, descriptor: bytes, grant: _Grant) -> None:
        """``grant`` gives up waiting: out of the queue, and everything it holds freed."""
        slot.dequeue(grant)
        if grant.owner in slot.queued:
            self._graph_changed()
        if not slot.holders and not slot.queue and self._slots.get(descriptor) is slot:
            del self._slots[descriptor]
        else:
            self._wake_slot(slot)  # it may have stood first in line: the next one may take
        self._drop(grant)

    def _drop(self, grant: _Grant) -> None:
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
                for watcher in self._watchers.get(descriptor, ()):
                    watcher.notify()
        grant.acquired = 0
        if grant.waiting_on is not None:
            # Dropped while it waits (its partial locks expired): it gives up when woken.
            self._notify(grant)

    # --- waking ------------------------------------------------------------------

    def _notify(self, grant: _Grant) -> None:
        """Wake ``grant``'s thread if it sleeps in a wait; the caller holds the mutex."""
        if grant.wakeup is not None:
            grant.wakeup.notify()
            self._notified += 1

    def _wake_slot(self, slot: _Slot) -> None:
        """Wake the calls queued on ``slot`` that may take it now, after its holders or
        its queue changed: the first in line when no one holds it, else the calls of the
        holding owner (reentry). The others stay asleep: they could not take it, and their
        deadlock checks are due only when the graph changes (``_graph_changed``). A holder
        whose lease ran out is still listed: the first waiter's timed wait finds it."""
        if not slot.holders:
            if slot.queue:
                self._notify(slot.queue[0])
            return
        owner = slot.holders[0].owner
        if owner in slot.queued:
            for waiting in slot.queue:
                if waiting.owner == owner:
                    self._notify(waiting)

    def _graph_changed(self) -> None:
        """The wait-for graph gained an edge no new wait added (see ``_graph_changes``):
        every waiting call wakes and checks for a cycle again, as a cycle may now run
        through any of them."""
        self._graph_changes += 1
        for grants in self._waiting.values():
            for grant in grants:
                self._notify(grant)

    # --- deadlocks -----------------------------------------------------------------

    def _edges(self, grant: _Grant) -> list[str | tuple[bytes, int]]:
        """Where a waiting grant's wait leads in the wait-for graph: the owner holding its
        descriptor, and the owners queued ahead of its owner's first grant in that queue
        (a later one is granted with the first, by reentry). Those ahead are one node,
        ``(descriptor, n)``: the first ``n`` of the queue, which leads to the ``n``-th's
        owner and to ``(descriptor, n - 1)``; a queue of many waiters costs a chain,
        not an edge from each waiter to each one ahead of it."""
        descriptor = grant.waiting_on
        slot = None if descriptor is None else self._slots.get(descriptor)
        if descriptor is None or slot is None or grant not in slot.queue:
            return []
        out: list[str | tuple[bytes, int]] = []
        now = self._clock()
        live = [h for h in slot.holders if h.expires_at > now]
        if live:
            if live[0].owner == grant.owner:
                return []  # granted by reentry as soon as its thread wakes: no wait
            out.append(live[0].owner)
        ahead = slot.first_of_owner(grant)
        if ahead:
            out.append((descriptor, ahead))
        return out

    def _ahead(self, node: tuple[bytes, int]) -> list[str | tuple[bytes, int]]:
        descriptor, count = node
        slot = self._slots.get(descriptor)
        if slot is None or count > len(slot.queue):
            return []
        out: list[str | tuple[bytes, int]] = [slot.queue[count - 1].owner]
        if count > 1:
            out.append((descriptor, count - 1))
        return out

    def _find_cycle(self, grant: _Grant, passed: bool) -> list[tuple[str, bytes, str]] | None:
        """The shortest cycle of the wait-for graph that starts with ``grant``'s wait and
        leads back to its owner, as (owner, descriptor it waits on, owner it waits for)
        edges; ``None`` when there is none. Breadth first, each node once.

        When ``grant`` went ahead of another owner's call (``passed``), its arrival also
        added edges into its owner, and the cycle they close may leave the owner by
        another of its waiting calls: the search then starts from each of them."""
        start = grant.owner
        # How each node was reached: from which owner, waiting on which descriptor.
        reached: dict[str | tuple[bytes, int], tuple[str, bytes]] = {}
        frontier: deque[str | tuple[bytes, int]] = deque()

        def visit(node: str | tuple[bytes, int], owner: str, descriptor: bytes) -> None:
            if node not in reached:
                reached[node] = (owner, descriptor)
                frontier.append(node)

        assert grant.waiting_on is not None
        for node in self._edges(grant):
            visit(node, start, grant.waiting_on)
        if passed:
            for other in self._waiting.get(start, ()):
                assert other.waiting_on is not None
                for node in self._edges(other):
                    visit(node, start, other.waiting_on)
        while frontier and start not in reached:
            node = frontier.popleft()
            if isinstance(node, str):
                for waiting in self._waiting.get(node, ()):
                    assert waiting.waiting_on is not None
                    for target in self._edges(waiting):
                        visit(target, node, waiting.waiting_on)
            else:
                for target in self._ahead(node):
                    visit(target, *reached[node])
        if start not in reached:
            return None
        edges: list[tuple[str, bytes, str]] = []
        current = start
        while True:
            before, descriptor = reached[current]
            edges.append((before, descriptor, current))
            if before == start:
                return edges[::-1]
            current = before

    def _check_deadlock(
        self, slot: _Slot, descriptor: bytes, grant: _Grant, passed: bool = False
    ) -> None:
        """Raise :class:`DeadlockError` if ``grant``'s wait closes a cycle, after giving up
        the wait and what it holds so that the others of the cycle proceed. Giving up
        takes back every edge its arrival added (``passed``: also those into its owner
        from the calls it went ahead of), so the graph is left without the cycle."""
        grant.checked_at = self._graph_changes
        cycle = self._find_cycle(grant, passed)
        if cycle is None:
            return
        text = "; ".join(
            f"{_cut(waiter)} waits for {_cut(holder)} on '{render_descriptor(d)}'"
            for waiter, d, holder in cycle
        )
        self._leave(slot, descriptor, grant)
        metrics.record_lock_wait(grant.wait_started)
        metrics.record_lock_deadlock()
        log.warning("deadlock in lock epoch %d: %s; victim %s", self.epoch, text, grant.owner)
        raise DeadlockError(
            f"deadlock: {text}; {_cut(grant.owner)} gives up its wait, "
            "releases this call's locks and aborts"
        )

    # --- holding -----------------------------------------------------------------

    def _live_grant(self, token: LockToken) -> _Grant | None:
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
            for d in wanted:
                self._watchers.setdefault(d, []).append(wakeup)
            try:
                while True:
                    self._check_open()
                    busy = [s for d in wanted if (s := self._slots.get(d)) and s.holders]
                    live = [s for s in busy if not self._expire_if_due(s)]
                    if not live:
                        return True
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        return False
                    wakeup.wait(min([remaining] + [self._time_to_expiry(s) for s in live]))
            finally:
                for d in wanted:
                    watchers = self._watchers[d]
                    watchers.remove(wakeup)
                    if not watchers:
                        del self._watchers[d]

    def _expire_if_due(self, slot: _Slot) -> bool:
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
            now = self._clock()
            found = []
            for grants in self._waiting.values():
                for grant in grants:
                    assert grant.waiting_on is not None and grant.waiting_since is not None
                    ahead = self._waits_behind(grant)
                    found.append(
                        LockWait(
                            owner=grant.owner,
                            descriptor=grant.waiting_on,
                            waited_s=max(0.0, now - grant.waiting_since),
                            waits_for=ahead,
                        )
                    )
        found.sort(key=lambda w: w.waited_s, reverse=True)
        return found[:limit]

    def _waits_behind(self, grant: _Grant) -> str | None:
        """The owner a waiting grant waits for first: the holder's, else the nearest
        queued ahead of its owner's first grant in the queue."""
        for node in self._edges(grant):
            if isinstance(node, str):
                return node
            descriptor, count = node
            return self._slots[descriptor].queue[count - 1].owner
        return None

    def waiter_count(self) -> int:
        """How many lock calls wait in the table now (the ``percolake_lock_waiters``
        gauge)."""
        return self._waiter_count

    def __len__(self) -> int:
        """How many lock batches are currently granted (live or not yet reaped)."""
        with self._mutex:
            return len(self._grants)
