"""Group commit: appends to one table that arrive together share one transaction.

A lakehouse commit is a read-modify-write of the table's head row, so commits of one
table serialise on it. Appends to one table that arrive while a commit of that table
is in flight queue up, and the next transaction commits all of them: one transaction
writes N consecutive versions, each with its own log record, files and marks
(``Catalog.commit_group``), so N writers pay for one commit point. A group is cut
at ``max_group_commits`` requests or ``max_group_bytes``; an overwrite and a
row-level statement always commit alone (they depend on what they read). Each caller gets its own
version, its own check failure, or, when the transaction's outcome stays unknown,
its own ``commit-unknown``; sending the same request again (same ``job_id``) then
returns the version it committed, or commits it now if it did not. Several
gateways on one store stay correct: grouping happens inside one gateway, and
between gateways the head row's conflict still decides (first committer wins, the
loser retries).

Nothing here knows gRPC: the servicer (``service.servicer``) hands each checked
request to :meth:`GroupCommitter.commit` and waits for its own result.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from spark_integration.engine import Catalog, CommitRequest, Committed
from spark_integration.engine.model import OVERWRITE
from wire import metrics


def _alone(request: CommitRequest) -> bool:
    """Whether the request commits in a group of its own (it depends on what it read)."""
    return (
        request.operation == OVERWRITE
        or request.read_set is not None
        or request.new_schema_json is not None
    )


@dataclass(frozen=True)
class LakehouseLimits:
    """Bounds of one group commit."""

    max_group_commits: int = 64
    max_group_bytes: int = 4 * 1024 * 1024
    #: How long a group may wait for more members (see ``GroupCommitter._gather``).
    max_group_wait_ms: float = 30.0

    def __post_init__(self) -> None:
        if self.max_group_commits < 1:
            raise ValueError("max_group_commits must be at least 1")
        if self.max_group_bytes < 1:
            raise ValueError("max_group_bytes must be at least 1")
        if not 0 <= self.max_group_wait_ms <= 1000:
            raise ValueError("max_group_wait_ms must be between 0 and 1000")


@dataclass(eq=False)
class _Member:
    request: CommitRequest
    #: Who sent it (a gRPC peer), or None when unknown: see ``GroupCommitter._gather``.
    caller: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Committed | None = None
    error: BaseException | None = None


@dataclass(eq=False)
class TableQueue:
    pending: deque[_Member] = field(default_factory=deque)
    running: bool = False
    last_size: int = 0  # members of the table's last group
    last_commit_s: float = 0.0  # how long that group's commit took
    #: The known callers the last group answered: each is likely to send its next
    #: commit a round trip later (see ``GroupCommitter._gather``).
    answered: frozenset[str] = frozenset()
    answered_at: float = 0.0  # when (time.monotonic) the last group was answered


class GroupCommitter:
    """Commits of one table from this gateway, queued and committed in groups.

    Each table with commits waiting has one worker thread; it takes the longest
    group the limits allow from the head of the queue, commits it, hands every
    member its result, and exits when the queue is empty.

    Writers that were answered together come back together, a round trip apart: the
    first of them would otherwise start a group of one and the others queue behind
    it. And writers that queued while a group committed would start the next group
    alone, leaving those just answered to queue behind it: eight writers settle into
    two cohorts of four that take turns, each commit point carrying half of them. So
    a group waits a little for more members (:meth:`_gather`), while it is smaller
    than the table's last group or some caller the last group answered has not sent
    its next commit yet, and never longer than a quarter of the last commit took
    (nor ``max_group_wait_ms``; for a caller, counted from its answer): on a store
    where a commit takes 100 ms, a few milliseconds of waiting double a group. A
    caller is known by its gRPC peer (one channel of one writer process); commits
    without one are only counted.
    """

    def __init__(self, limits: LakehouseLimits) -> None:
        self._limits = limits
        #: Guards every queue; notified when a request is queued.
        self._lock = threading.Condition()
        self._queues: dict[tuple[str, str], TableQueue] = {}

    def commit(
        self, catalog: Catalog, name: str, request: CommitRequest, caller: str | None = None
    ) -> Committed:
        """Commit ``request`` in the next group of table ``name``; ``caller``: who sent
        it (its gRPC peer), to wait for callers that come back together."""
        member = _Member(request, caller)
        key = (catalog.layout.catalog, name)
        with self._lock:
            queue = self._queues.setdefault(key, TableQueue())
            queue.pending.append(member)
            start = not queue.running
            queue.running = True
            self._lock.notify_all()
        if start:
            threading.Thread(
                target=self._drain,
                args=(catalog, name, queue),
                name=f"percolake-lakehouse-commit-{name}",
                daemon=True,
            ).start()
        member.done.wait()
        if member.error is not None:
            raise member.error
        assert member.result is not None
        return member.result

    # Hooks for test builds of the gateway (``percolake.tools.chaos.failpoints_serve``): a
    # group about to be committed, and one committed whose members are not yet told.

    def before_group(self, name: str, requests: list[CommitRequest]) -> None:
        """Called with each group before its transaction begins."""

    def after_group(self, name: str, requests: list[CommitRequest]) -> None:
        """Called with each group after its transaction committed, before any reply."""

    def _take(self, queue: TableQueue) -> list[_Member]:
        """The next group: overwrites and DML alone, appends up to the limits (under the lock)."""
        first = queue.pending.popleft()
        group = [first]
        if _alone(first.request):
            return group
        size = first.request.size_bytes()
        while queue.pending and len(group) < self._limits.max_group_commits:
            nxt = queue.pending[0]
            if _alone(nxt.request):
                break
            size += nxt.request.size_bytes()
            if size > self._limits.max_group_bytes:
                break
            group.append(queue.pending.popleft())
        return group

    def _gather(self, queue: TableQueue) -> None:
        """Wait (under the lock), within the bounds, for a group as big as the last and
        for every caller the last group answered."""
        if _alone(queue.pending[0].request):
            return
        wait_s = min(self._limits.max_group_wait_ms / 1000, queue.last_commit_s / 4)
        most = self._limits.max_group_commits
        want = min(queue.last_size, most)
        deadline = time.monotonic() + wait_s
        # A caller answered by the last group is waited for only as long after its
        # answer: one that has not come back by then is not committing in a loop (a
        # job of its own pace), and the commits queued meanwhile go without it.
        callers_deadline = min(deadline, queue.answered_at + wait_s)

        def until() -> float | None:
            """How long to wait yet, or None: the group is as big as it will get."""
            if len(queue.pending) >= most:
                return None
            if len(queue.pending) < want:
                return deadline
            queued = {m.caller for m in queue.pending}
            if any(caller not in queued for caller in queue.answered):
                return callers_deadline
            return None

        while (end := until()) is not None:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._lock.wait(left)

    def _drain(self, catalog: Catalog, name: str, queue: TableQueue) -> None:
        while True:
            with self._lock:
                if not queue.pending:
                    queue.running = False
                    return
                self._gather(queue)
                group = self._take(queue)
            started = time.monotonic()
            try:
                self.before_group(name, [m.request for m in group])
                results = catalog.commit_group(name, [m.request for m in group])
                self.after_group(name, [m.request for m in group])
            except BaseException as exc:  # the transaction's failure is every member's
                # BaseException too: a worker that died here would leave its callers
                # waiting forever and the queue marked running.
                for member in group:
                    member.error = exc
                    member.done.set()
                continue
            metrics.LAKEHOUSE_GROUP_COMMITS.observe(len(group))
            answered_at = time.monotonic()
            with self._lock:
                queue.last_size, queue.last_commit_s = len(group), answered_at - started
                queue.answered = frozenset(m.caller for m in group if m.caller is not None)
                queue.answered_at = answered_at
            for member, result in zip(group, results, strict=True):
                if isinstance(result, BaseException):
                    member.error = result
                else:
                    member.result = result
                member.done.set()
