"""Who waits for whom in the lock table: its queues and the wait-for graph over them.

A :class:`Slot` is one descriptor's holders and queue (in priority order); a
:class:`Grant` is one lock call, holding or waiting. :class:`WaitForGraph` keeps the
calls waiting now and follows, from any of them, whom its owner waits for, which is
what the table's deadlock check and ``LockTable.waits()`` read; :class:`ReleaseWatchers`
are the readers waiting for descriptors to be released. None of it locks: the table
calls it under its mutex.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from lockserver._table import LockToken

#: A node of the wait-for graph: an owner, or ``(descriptor, n)``, the first ``n`` calls
#: queued on the descriptor (see :meth:`WaitForGraph.edges`).
Node = str | tuple[bytes, int]
#: An edge of a cycle: (owner, the descriptor it waits on, the owner it waits for).
Edge = tuple[str, bytes, str]


class LockWait(NamedTuple):
    """A lock call waiting now, as :meth:`LockTable.waits` reports it."""

    owner: str
    descriptor: bytes  # the descriptor it waits for now
    waited_s: float  # since the call began to wait (on this or an earlier descriptor)
    waits_for: str | None  # the owner it waits behind: the holder, else the queue ahead


@dataclass(slots=True, eq=False)  # compared by identity: queues hold and remove them
class Grant:
    token: LockToken
    owner: str
    descriptors: tuple[bytes, ...]
    lease_ms: int
    expires_at: float
    acquired: int = 0  # descriptors acquired so far, in sorted order
    #: Lower goes first among the prioritized waiters queued since the last unprioritized
    #: one; ``None``: in arrival order, and no later call passes it (see ``Slot.enqueue``).
    priority: int | None = None
    waiting_on: bytes | None = None  # the descriptor whose queue it stands in
    waiting_since: float | None = None  # table clock, when the call first waited
    checked_at: int = -1  # the table's graph changes at its last deadlock check
    wait_started: float | None = None  # time.monotonic(), when it first waited (metrics)
    #: What its thread sleeps on while it waits (on the table's mutex); ``None`` otherwise.
    wakeup: threading.Condition | None = None


@dataclass(slots=True)
class Slot:
    #: Live grants holding the descriptor: one, or several of one owner (reentrancy).
    holders: list[Grant] = field(default_factory=list)
    queue: deque[Grant] = field(default_factory=deque)
    #: How many grants of each owner stand in the queue (for the wait-for graph).
    queued: dict[str, int] = field(default_factory=dict)

    def enqueue(self, grant: Grant) -> bool:
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

    def dequeue(self, grant: Grant) -> None:
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

    def takers(self) -> list[Grant]:
        """The calls queued here that may take the descriptor now: the first in line when
        no one holds it, else the calls of the holding owner (reentry). A holder whose
        lease ran out is still listed: the first waiter's timed wait finds it."""
        if not self.holders:
            return [self.queue[0]] if self.queue else []
        owner = self.holders[0].owner
        if owner not in self.queued:
            return []
        return [waiting for waiting in self.queue if waiting.owner == owner]

    def time_to_expiry(self, clock: Callable[[], float]) -> float:
        """How long until the first holder's lease runs out; a short poll when none holds."""
        if not self.holders:
            return 0.05
        return max(min(h.expires_at for h in self.holders) - clock(), 0.001)

    def first_of_owner(self, grant: Grant) -> int:
        """Where the first grant of ``grant``'s owner stands in the queue (it stands in
        it): a call behind one of its own owner's is granted with that one (reentry),
        so it waits only for what stands ahead of that one."""
        position = self.queue.index(grant)
        if self.queued[grant.owner] > 1:
            for ahead in range(position):
                if self.queue[ahead].owner == grant.owner:
                    return ahead
        return position


class WaitForGraph:
    """The wait-for graph between owners, read from the table's slots and the calls
    waiting now (its nodes, kept here). The table adds a call when it begins to wait and
    removes it when the wait ends; edges are never stored, but followed from the slots
    each time, so they cannot go stale."""

    def __init__(self, slots: dict[bytes, Slot], clock: Callable[[], float]) -> None:
        self._slots = slots  # the table's own dict: its changes show here
        self._clock = clock
        #: Waiting grants by owner: the nodes of the wait-for graph.
        self.waiting: dict[str, list[Grant]] = {}
        self.count = 0

    def begin(self, grant: Grant, descriptor: bytes, wakeup: threading.Condition) -> None:
        """``grant`` begins to wait for ``descriptor`` (it stands in its queue), its thread
        sleeping on ``wakeup``."""
        grant.waiting_on = descriptor
        grant.checked_at = -1  # a new wait: checked before it sleeps
        grant.wakeup = wakeup
        if grant.waiting_since is None:
            grant.waiting_since = self._clock()
        self.waiting.setdefault(grant.owner, []).append(grant)
        self.count += 1

    def end(self, grant: Grant) -> None:
        grant.waiting_on = None
        grant.wakeup = None
        mine = self.waiting.get(grant.owner)
        if mine is None or grant not in mine:
            return  # the table was closed: its graph is gone already
        mine.remove(grant)
        if not mine:
            del self.waiting[grant.owner]
        self.count -= 1

    def clear(self) -> None:
        self.waiting.clear()
        self.count = 0

    def grants(self) -> Iterator[Grant]:
        """Every waiting call, by owner."""
        for grants in self.waiting.values():
            yield from grants

    def edges(self, grant: Grant) -> list[Node]:
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
        out: list[Node] = []
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

    def _ahead(self, node: tuple[bytes, int]) -> list[Node]:
        descriptor, count = node
        slot = self._slots.get(descriptor)
        if slot is None or count > len(slot.queue):
            return []
        out: list[Node] = [slot.queue[count - 1].owner]
        if count > 1:
            out.append((descriptor, count - 1))
        return out

    def find_cycle(self, grant: Grant, passed: bool) -> list[Edge] | None:
        """The shortest cycle of the wait-for graph that starts with ``grant``'s wait and
        leads back to its owner, as (owner, descriptor it waits on, owner it waits for)
        edges; ``None`` when there is none. Breadth first, each node once.

        When ``grant`` went ahead of another owner's call (``passed``), its arrival also
        added edges into its owner, and the cycle they close may leave the owner by
        another of its waiting calls: the search then starts from each of them."""
        start = grant.owner
        # How each node was reached: from which owner, waiting on which descriptor.
        reached: dict[Node, tuple[str, bytes]] = {}
        frontier: deque[Node] = deque()

        def visit(node: Node, owner: str, descriptor: bytes) -> None:
            if node not in reached:
                reached[node] = (owner, descriptor)
                frontier.append(node)

        assert grant.waiting_on is not None
        for node in self.edges(grant):
            visit(node, start, grant.waiting_on)
        if passed:
            for other in self.waiting.get(start, ()):
                assert other.waiting_on is not None
                for node in self.edges(other):
                    visit(node, start, other.waiting_on)
        while frontier and start not in reached:
            node = frontier.popleft()
            if isinstance(node, str):
                for waiting in self.waiting.get(node, ()):
                    assert waiting.waiting_on is not None
                    for target in self.edges(waiting):
                        visit(target, node, waiting.waiting_on)
            else:
                for target in self._ahead(node):
                    visit(target, *reached[node])
        if start not in reached:
            return None
        edges: list[Edge] = []
        current = start
        while True:
            before, descriptor = reached[current]
            edges.append((before, descriptor, current))
            if before == start:
                return edges[::-1]
            current = before

    def waits(self, now: float) -> list[LockWait]:
        """Every waiting call, longest wait first (``now`` on the table's clock)."""
        found = []
        for grant in self.grants():
            assert grant.waiting_on is not None and grant.waiting_since is not None
            found.append(
                LockWait(
                    owner=grant.owner,
                    descriptor=grant.waiting_on,
                    waited_s=max(0.0, now - grant.waiting_since),
                    waits_for=self.waits_behind(grant),
                )
            )
        found.sort(key=lambda w: w.waited_s, reverse=True)
        return found

    def waits_behind(self, grant: Grant) -> str | None:
        """The owner a waiting grant waits for first: the holder's, else the nearest
        queued ahead of its owner's first grant in the queue."""
        for node in self.edges(grant):
            if isinstance(node, str):
                return node
            descriptor, count = node
            return self._slots[descriptor].queue[count - 1].owner
        return None


class ReleaseWatchers:
    """The conditions of the ``LockTable.wait_until_released`` calls, by the descriptors
    they watch: a reader is woken when a holder of one of them is released or dropped,
    or when the table closes, and never queues (a reader never delays a writer)."""

    def __init__(self) -> None:
        self._by_descriptor: dict[bytes, list[threading.Condition]] = {}

    @contextmanager
    def watching(
        self, descriptors: tuple[bytes, ...], wakeup: threading.Condition
    ) -> Iterator[None]:
        """``wakeup`` is notified for ``descriptors`` while the block runs."""
        for d in descriptors:
            self._by_descriptor.setdefault(d, []).append(wakeup)
        try:
            yield
        finally:
            for d in descriptors:
                watchers = self._by_descriptor[d]
                watchers.remove(wakeup)
                if not watchers:
                    del self._by_descriptor[d]

    def notify(self, descriptor: bytes) -> None:
        for watcher in self._by_descriptor.get(descriptor, ()):
            watcher.notify()

    def notify_all(self) -> None:
        for watchers in self._by_descriptor.values():
            for watcher in watchers:
                watcher.notify()
