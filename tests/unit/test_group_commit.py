"""Group commit in the catalog and the gateway's committer, in one process.

``Catalog.commit_group`` writes several commits as consecutive versions of one
transaction; :class:`GroupCommitter` decides which requests go together. The
end-to-end tests through real gateway processes are in
``tests/integration/test_lakehouse_service.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from spark_integration.engine import Catalog, CommitRequest, Committed
from spark_integration.engine.errors import ConcurrentModificationError
from spark_integration.engine.model import (
    APPEND,
    OVERWRITE,
    FileEntry,
    Layout,
    LogRecord,
    TableMeta,
)
from spark_integration.service.group_commit import (
    GroupCommitter,
    LakehouseLimits,
    TableQueue,
    _Member,
)
from txn import TransactionConfig, TransactionManager

pytestmark = pytest.mark.unit

TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)


@pytest.fixture(params=["memory", "sqlite"])
def tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"
    manager = TransactionManager.embedded(url, config=TEST_CONFIG)
    yield manager
    manager.close()


def make_catalog(
    tm: TransactionManager, follow_ups: Callable[[Callable[[], None]], object] | None = None
) -> Catalog:
    catalog = Catalog(tm, "c", follow_ups=follow_ups, commit_ts_of=tm.outcome_of)
    catalog.create(TableMeta("t", "{}", (), "/w/t", 0), job_id="create")
    return catalog


def append(job: str, n_files: int = 1, **kw: object) -> CommitRequest:
    files = tuple(FileEntry(f"_lh_job={job}/f{i}.parquet", 10, 1) for i in range(n_files))
    return CommitRequest(APPEND, files, job, 10**13, **kw)  # type: ignore[arg-type]


def records(tm: TransactionManager, catalog: Catalog) -> list[LogRecord]:
    with tm.begin() as tx:
        return [
            LogRecord.decode(value)
            for _, column, value in tx.scan(
                catalog.layout.log, Layout.prefix("t"), Layout.prefix_end("t")
            )
            if column == Layout.COL_RECORD
        ]


def test_a_group_writes_consecutive_versions_in_one_transaction(tm: TransactionManager) -> None:
    catalog = make_catalog(tm)
    got = catalog.commit_group("t", [append("a", 2), append("b"), append("c", 3)])
    assert [g.version for g in got if isinstance(g, Committed)] == [1, 2, 3]
    assert all(isinstance(g, Committed) and g.group_size == 3 and not g.replayed for g in got)
    logs = records(tm, catalog)[1:]
    assert [r.job_id for r in logs] == ["a", "b", "c"]
    assert [r.added_count for r in logs] == [2, 1, 3]
    assert len({r.txn_start_ts for r in logs}) == 1  # one transaction
    _, version, files = catalog.files("t", None, FileEntry)
    assert version == 3 and len(files) == 6
    assert [len(catalog.files("t", v, FileEntry)[2]) for v in (1, 2, 3)] == [2, 3, 6]


def test_a_member_that_fails_its_own_check_commits_nothing_and_the_others_commit(
    tm: TransactionManager,
) -> None:
    catalog = make_catalog(tm)
    catalog.commit_group("t", [append("first")])
    stale = CommitRequest(OVERWRITE, (), "stale", 10**13, base_version=0)
    got = catalog.commit_group("t", [append("a"), stale, append("b")])
    assert isinstance(got[1], ConcurrentModificationError)
    assert [g.version for g in got if isinstance(g, Committed)] == [2, 3]
    assert [r.job_id for r in records(tm, catalog)] == ["create", "first", "a", "b"]


def test_a_resent_job_and_a_repeated_batch_get_their_first_version(
    tm: TransactionManager,
) -> None:
    catalog = make_catalog(tm)
    (first,) = catalog.commit_group("t", [append("a", app_id="app", batch_id=7)])
    assert isinstance(first, Committed) and first.version == 1
    got = catalog.commit_group(
        "t",
        [
            append("a", app_id="app", batch_id=7),  # the same job sent again: its own version
            append("b", app_id="app", batch_id=7),  # another job, same batch: a replay
            append("c", app_id="app", batch_id=8),
            append("d", app_id="app", batch_id=8),  # a replay of a member of this group
            append("c", app_id="app", batch_id=8),  # c again, inside the group
        ],
    )
    assert [(g.version, g.replayed) for g in got if isinstance(g, Committed)] == [
        (1, False),
        (1, True),
        (2, False),
        (2, True),
        (2, False),
    ]
    assert [r.job_id for r in records(tm, catalog)] == ["create", "a", "c"]


def test_history_looks_up_every_commit_ts_the_gateway_does_not_record(
    tm: TransactionManager,
) -> None:
    held: list[Callable[[], None]] = []
    catalog = make_catalog(tm, follow_ups=held.append)  # follow-ups never run
    got = catalog.commit_group("t", [append("a"), append("b")])
    commit_ts = {g.commit_ts for g in got if isinstance(g, Committed)}
    assert len(commit_ts) == 1 and None not in commit_ts
    for work in held:
        work()
    with tm.begin() as tx:  # nothing recorded: one transaction less per commit
        assert not [
            c
            for _, c, _ in tx.scan(catalog.layout.log, Layout.prefix("t"), Layout.prefix_end("t"))
            if c == Layout.COL_COMMIT_TS
        ]
    history = catalog.history("t")
    assert [h.commit_ts for h in history[1:]] == [commit_ts.pop()] * 2
    assert history[0].commit_ts is not None  # create, also looked up


class HeldCommitter(GroupCommitter):
    """Holds the first group until ``release`` is set, recording every group's jobs."""

    def __init__(self, limits: LakehouseLimits) -> None:
        super().__init__(limits)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.groups: list[list[str]] = []

    def before_group(self, name: str, requests: list[CommitRequest]) -> None:
        self.groups.append([r.job_id for r in requests])
        self.entered.set()
        assert self.release.wait(30)


def test_requests_queued_behind_a_commit_go_together_within_the_limits(
    tm: TransactionManager,
) -> None:
    catalog = make_catalog(tm)
    committer = HeldCommitter(LakehouseLimits(max_group_commits=4))
    results: dict[str, Committed] = {}

    def submit(request: CommitRequest) -> None:
        results[request.job_id] = committer.commit(catalog, "t", request)

    first = threading.Thread(target=submit, args=(append("first"),))
    first.start()
    assert committer.entered.wait(30)
    queued = [append(f"q{i}") for i in range(5)]
    overwrite = CommitRequest(OVERWRITE, (), "ow", 10**13, base_version=6)
    threads = []
    for request in [*queued, overwrite]:
        thread = threading.Thread(target=submit, args=(request,))
        thread.start()
        threads.append(thread)
        while sum(len(q.pending) for q in committer._queues.values()) < len(threads):
            threading.Event().wait(0.001)
    committer.release.set()
    for thread in [first, *threads]:
        thread.join(30)
    assert committer.groups == [["first"], ["q0", "q1", "q2", "q3"], ["q4"], ["ow"]]
    assert [results[j].version for j in ["first", "q0", "q1", "q2", "q3", "q4", "ow"]] == list(
        range(1, 8)
    )
    assert results["q2"].group_size == 4 and results["ow"].group_size == 1


def test_a_group_is_cut_at_its_byte_bound() -> None:
    big = append("b0", 40).size_bytes()
    committer = HeldCommitter(LakehouseLimits(max_group_bytes=2 * big))
    committer.release.set()
    queue_requests = [append(f"b{i}", 40) for i in range(3)]
    queue = TableQueue()
    queue.pending.extend(_Member(r) for r in queue_requests)
    assert [m.request.job_id for m in committer._take(queue)] == ["b0", "b1"]
    assert [m.request.job_id for m in committer._take(queue)] == ["b2"]


def test_a_failed_group_transaction_reaches_every_member(tm: TransactionManager) -> None:
    catalog = make_catalog(tm)
    committer = HeldCommitter(LakehouseLimits())
    errors: list[BaseException] = []

    def boom(name: str, requests: list[CommitRequest]) -> None:
        raise RuntimeError("store gone (injected)")

    committer.after_group = boom  # type: ignore[method-assign]
    committer.release.set()

    def submit(job: str) -> None:
        try:
            committer.commit(catalog, "t", append(job))
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(f"j{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(errors) == 3
    # The worker survived: the next commit goes through.
    committer.after_group = lambda name, requests: None  # type: ignore[method-assign]
    assert committer.commit(catalog, "t", append("after")).version == 4


def test_a_group_waits_briefly_for_as_many_members_as_the_last_one() -> None:
    """Writers answered together come back a round trip apart; the group waits for them."""
    committer = GroupCommitter(LakehouseLimits(max_group_wait_ms=1000))
    queue = TableQueue(last_size=3, last_commit_s=60.0)  # allows the full second of waiting
    queue.pending.append(_Member(append("first")))

    def arrive() -> None:
        for job in ("second", "third"):
            with committer._lock:
                queue.pending.append(_Member(append(job)))
                committer._lock.notify_all()

    with committer._lock:
        threading.Timer(0.05, arrive).start()
        committer._gather(queue)
        assert [m.request.job_id for m in committer._take(queue)] == ["first", "second", "third"]


def test_a_group_waits_for_the_callers_the_last_group_answered() -> None:
    """Eight writers in two cohorts of four: the four queued while the others' group
    committed are as many as the last group, yet the group waits for the four just
    answered, so the cohorts merge and each commit point carries all eight."""
    committer = GroupCommitter(LakehouseLimits(max_group_wait_ms=1000))
    queue = TableQueue(
        last_size=2,
        last_commit_s=60.0,
        answered=frozenset({"w0", "w1"}),
        answered_at=time.monotonic(),
    )
    queue.pending.extend(_Member(append(f"q{i}"), f"w{i}") for i in (2, 3))

    def arrive() -> None:
        for i in (0, 1):
            with committer._lock:
                queue.pending.append(_Member(append(f"q{i}"), f"w{i}"))
                committer._lock.notify_all()

    with committer._lock:
        threading.Timer(0.05, arrive).start()
        committer._gather(queue)
        assert [m.caller for m in committer._take(queue)] == ["w2", "w3", "w0", "w1"]


def test_a_group_waits_no_longer_than_its_bound_for_a_caller_that_does_not_come() -> None:
    committer = GroupCommitter(LakehouseLimits(max_group_wait_ms=1000))
    committer._lock = lock = CountingCondition()
    queue = TableQueue(
        last_size=1, last_commit_s=0.2, answered=frozenset({"gone"}), answered_at=time.monotonic()
    )
    queue.pending.append(_Member(append("here"), "here"))
    with lock:
        committer._gather(queue)  # bound: a quarter of the last commit, 50 ms
    assert lock.waits >= 1 and len(queue.pending) == 1


def test_a_caller_answered_longer_ago_than_the_bound_is_not_waited_for() -> None:
    """Two jobs of their own pace on one table: the other job's last answer came a
    second ago, so it is not committing in a loop, and this commit goes at once."""
    committer = GroupCommitter(LakehouseLimits(max_group_wait_ms=1000))
    committer._lock = lock = CountingCondition()
    queue = TableQueue(
        last_size=1,
        last_commit_s=60.0,
        answered=frozenset({"other job"}),
        answered_at=time.monotonic() - 1.0,
    )
    queue.pending.append(_Member(append("mine"), "this job"))
    with lock:
        committer._gather(queue)
    assert lock.waits == 0


def test_the_last_group_answers_are_remembered_by_caller(tm: TransactionManager) -> None:
    catalog = make_catalog(tm)
    committer = GroupCommitter(LakehouseLimits())
    groups = REGISTRY.get_sample_value("percolake_lakehouse_group_commits_count") or 0.0
    committer.commit(catalog, "t", append("a"), "ipv4:127.0.0.1:5001")
    committer.commit(catalog, "t", append("b"))  # no caller known: counted only
    (queue,) = committer._queues.values()
    assert queue.answered == frozenset() and queue.last_size == 1
    committer.commit(catalog, "t", append("c"), "ipv4:127.0.0.1:5002")
    assert queue.answered == frozenset({"ipv4:127.0.0.1:5002"})
    # Each group that committed is counted, with its size.
    after = REGISTRY.get_sample_value("percolake_lakehouse_group_commits_count")
    assert after == groups + 3


class CountingCondition(threading.Condition):
    waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_no_waiting_without_a_bigger_last_group_or_a_missing_caller_or_with_waiting_off() -> None:
    for limits, last_size in ((LakehouseLimits(), 1), (LakehouseLimits(max_group_wait_ms=0), 8)):
        committer = GroupCommitter(limits)
        committer._lock = lock = CountingCondition()
        # The one caller the last group answered is the one queued: nobody to wait for.
        queue = TableQueue(last_size=last_size, last_commit_s=60.0, answered=frozenset({"w"}))
        queue.pending.append(_Member(append("only"), "w"))
        with lock:
            committer._gather(queue)
        assert lock.waits == 0 and len(queue.pending) == 1
