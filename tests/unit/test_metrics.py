"""The Prometheus metrics (``wire.metrics``) count exactly what a known workload did.

The registry is process-wide, so every figure is a delta read before and after.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from lockserver import LockTable
from storage_adapters import StoreTimeoutError, StoreUnavailableError, open_store
from tso import LeaderLease
from txn import COMMIT_STEPS, GarbageCollector, Isolation, TransactionConfig, TransactionManager
from txn import failpoints as fp
from txn.errors import CommitUnknownError, TransactionAbortedError, TransactionConflictError
from txn.gateway import TransactionServicer
from txn.tables import GC_TABLE, STATE_KEY, GcState
from wire import metrics
from wire.v1 import transaction_pb2 as pb

pytestmark = pytest.mark.unit

T = "t"


def value(name: str, **labels: str) -> float:
    got = REGISTRY.get_sample_value(name, labels)
    return 0.0 if got is None else got


class Deltas:
    """Readings of a set of samples, to compare after the workload."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self._before = {
            (name, tuple(sorted(lb.items()))): value(name, **lb) for name, lb in samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return value(name, **labels) - self._before[key]


def _samples() -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = [
        ("percolake_commits_total", {}),
        ("percolake_commit_unknown_total", {}),
        ("percolake_commit_seconds_count", {}),
        ("percolake_timestamps_served_total", {}),
        ("percolake_lock_waits_total", {}),
        ("percolake_lock_wait_seconds_count", {}),
        ("percolake_lock_wait_seconds_sum", {}),
    ]
    out += [("percolake_aborts_total", {"reason": r}) for r in metrics.ABORT_REASONS]
    out += [("percolake_commit_step_seconds_count", {"step": s}) for s in COMMIT_STEPS]
    out += [("percolake_store_errors_total", {"op": op}) for op in ("write", "commit_point")]
    for outcome in metrics.FAILED_COMMIT_OUTCOMES:
        out += [
            ("percolake_commit_failed_seconds_count", {"outcome": outcome}),
            ("percolake_commit_failed_seconds_sum", {"outcome": outcome}),
        ]
    return out


@pytest.fixture
def tm() -> Iterator[TransactionManager]:
    config = TransactionConfig(lock_wait_ms=50, settle_attempts=2, settle_backoff_ms=1)
    with TransactionManager.embedded("memory://", config) as manager:
        yield manager


def test_a_known_workload_is_counted_exactly(tm: TransactionManager) -> None:
    plain, conflicts = 4, 3
    deltas = Deltas(*_samples())
    timestamps = 0  # one per begin, one per commit that reaches the commit_ts step

    for i in range(plain):
        tx = tm.begin()
        tx.put(T, b"row%d" % i, b"c", b"v")
        tx.commit()
        timestamps += 2
    for i in range(conflicts):  # two writers of one cell: the first to commit wins
        first, second = tm.begin(), tm.begin()
        first.put(T, b"hot%d" % i, b"c", b"first")
        second.put(T, b"hot%d" % i, b"c", b"second")
        first.commit()
        with pytest.raises(TransactionConflictError):
            second.commit()  # locks, writes, then the check finds the first
        timestamps += 3
    aborted = tm.begin()
    aborted.put(T, b"gone", b"c", b"v")
    aborted.abort()
    timestamps += 1

    committed = plain + conflicts
    assert deltas("percolake_commits_total") == committed
    assert deltas("percolake_aborts_total", reason="conflict") == conflicts
    assert deltas("percolake_aborts_total", reason="user") == 1
    others = set(metrics.ABORT_REASONS) - {"conflict", "user"}
    assert {r: deltas("percolake_aborts_total", reason=r) for r in others} == dict.fromkeys(
        others, 0
    )
    assert deltas("percolake_commit_unknown_total") == 0
    # Step latencies are those of the commits that committed: one sample per step each.
    for step in COMMIT_STEPS:
        assert deltas("percolake_commit_step_seconds_count", step=step) == committed, step
    assert deltas("percolake_commit_seconds_count") == committed
    # The embedded manager takes its timestamps one call at a time, each a range of one.
    assert deltas("percolake_timestamps_served_total") == timestamps
    assert deltas("percolake_lock_waits_total") == 0  # sequential: nobody waited


def test_each_abort_reason_comes_from_what_the_commit_raised(tm: TransactionManager) -> None:
    deltas = Deltas(*_samples())

    # lock_timeout: a committer holds the cell's lock (its lock step done) too long.
    holder, waiter = tm.begin(), tm.begin()
    holder.put(T, b"locked", b"c", b"h")
    waiter.put(T, b"locked", b"c", b"w")
    commit = holder.committer()
    assert commit.step() and commit.next_step == "write"
    with pytest.raises(TransactionConflictError, match="waiting for locks"):
        waiter.commit()
    commit.run()

    # validation: a SERIALIZABLE transaction's read changed before its commit.
    reader = tm.begin(Isolation.SERIALIZABLE)
    assert reader.get(T, b"locked", b"c") == b"h"
    tm.run(lambda tx: tx.put(T, b"locked", b"c", b"new"))
    reader.put(T, b"elsewhere", b"c", b"v")
    with pytest.raises(TransactionConflictError, match="serialization failure"):
        reader.commit()

    # store_error: the store fails a write of the commit.
    tm.failpoints.enable(
        fp.AFTER_WRITE, fp.raise_error(lambda: StoreUnavailableError("down")), times=1
    )
    broken = tm.begin()
    broken.put(T, b"w", b"c", b"v")
    with pytest.raises(TransactionAbortedError, match="store error in step write"):
        broken.commit()

    # unknown: the commit point's reply is lost and settling it fails every time.
    _commit_with_an_unknown_outcome(tm)

    assert deltas("percolake_aborts_total", reason="lock_timeout") == 1
    assert deltas("percolake_lock_waits_total") == 1  # the waiter, timed out
    assert deltas("percolake_lock_wait_seconds_count") == 1
    assert deltas("percolake_aborts_total", reason="validation") == 1
    assert deltas("percolake_aborts_total", reason="store_error") == 1
    assert deltas("percolake_store_errors_total", op="write") == 1
    # The lost reply and both settling attempts (settle_attempts=2).
    assert deltas("percolake_store_errors_total", op="commit_point") == 3
    assert deltas("percolake_commit_unknown_total") == 1
    assert deltas("percolake_commits_total") == 2  # the holder, and tm.run's writer
    assert deltas("percolake_aborts_total", reason="conflict") == 0


def test_failed_commits_have_their_latency_by_outcome(tm: TransactionManager) -> None:
    """A commit that aborted or whose outcome is unknown is timed too, in
    percolake_commit_failed_seconds{outcome}; percolake_commit_seconds still times only
    commits that committed. Fails before issue 31: no failed commit was timed at all."""
    deltas = Deltas(*_samples())
    first, second = tm.begin(), tm.begin()
    first.put(T, b"hot", b"c", b"first")
    second.put(T, b"hot", b"c", b"second")
    first.commit()
    with pytest.raises(TransactionConflictError):
        second.commit()  # lock, write, then the check finds the first: aborted
    _commit_with_an_unknown_outcome(tm)

    assert deltas("percolake_commit_failed_seconds_count", outcome="aborted") == 1
    assert deltas("percolake_commit_failed_seconds_count", outcome="unknown") == 1
    for outcome in metrics.FAILED_COMMIT_OUTCOMES:  # time passed in each: steps ran
        assert deltas("percolake_commit_failed_seconds_sum", outcome=outcome) > 0, outcome
    assert deltas("percolake_commit_seconds_count") == 1  # the first writer only


def test_a_lock_that_waited_and_got_the_lock_is_counted() -> None:
    deltas = Deltas(*_samples())
    table = LockTable()
    token = table.lock([b"shared"], "first", 10_000)
    assert token is not None
    assert table.lock([b"shared"], "try", 10_000) is None  # no wait allowed: not a wait
    release = threading.Timer(0.05, table.unlock, [token])
    release.start()
    got = table.lock([b"shared"], "second", 10_000, wait_timeout_ms=10_000)
    release.join()
    assert got is not None
    assert deltas("percolake_lock_waits_total") == 1
    assert deltas("percolake_lock_wait_seconds_count") == 1
    assert deltas("percolake_lock_wait_seconds_sum") >= 0.04


def test_the_locks_held_and_open_transactions_gauges(tm: TransactionManager) -> None:
    gc.collect()  # no dead lock table or gateway may leave the sums during the readings
    gc.disable()
    try:
        locks_before = value("percolake_locks_held")
        tx = tm.begin()
        tx.put(T, b"g", b"c", b"v")
        commit = tx.committer()
        commit.step()  # lock: one batch (the commit lock and the cell's)
        assert value("percolake_locks_held") - locks_before == 1
        commit.run()
        assert value("percolake_locks_held") - locks_before == 0

        gateway = TransactionServicer(tm)
        try:
            open_before = value("percolake_open_transactions")
            begun = [gateway.Begin(pb.BeginRequest(), None) for _ in range(3)]  # type: ignore[arg-type]
            assert value("percolake_open_transactions") - open_before == 3
            gateway.Abort(
                pb.AbortRequest(txn_id=begun[0].txn_id, commit_secret=begun[0].commit_secret),
                None,  # type: ignore[arg-type]
            )
            assert value("percolake_open_transactions") - open_before == 2
        finally:
            gateway.shutdown()  # aborts the other two: reason "shutdown"
        assert value("percolake_open_transactions") - open_before == 0
    finally:
        gc.enable()


def test_the_gateway_says_why_it_aborted() -> None:
    deltas = Deltas(*_samples())
    with TransactionManager.embedded("memory://") as manager:
        gateway = TransactionServicer(manager)
        for _ in range(2):
            gateway.Begin(pb.BeginRequest(), None)  # type: ignore[arg-type]
        gateway.shutdown()
    assert deltas("percolake_aborts_total", reason="shutdown") == 2
    assert deltas("percolake_aborts_total", reason="user") == 0


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_is_leader_follows_the_lease_at_scrape_time_not_step_downs() -> None:
    """``percolake_is_leader`` is 1 exactly while a lease of this process is valid, and
    every replica exports the epoch it last read and the leader row's age (issue 31).

    Fails on the code before this fix: the gauge changed only when a term started or
    ended by a step, so a leader whose renewals stopped (store down, process paused)
    kept exporting 1 after its lease ran out, and a follower exported no series at all.
    """
    role = "metrics-test"  # a role of its own: the registry is the process's
    store, clock = open_store("memory://"), _FakeClock()
    leader = LeaderLease(store, role, address="a", lease_ms=1000, clock=clock)
    leader.step()
    assert value("percolake_is_leader", role=role) == 1
    assert value("percolake_leader_epoch", role=role) == 1
    assert value("percolake_leader_row_age_seconds", role=role) == 0
    clock.now += 0.5
    assert value("percolake_leader_row_age_seconds", role=role) == 0.5
    clock.now += 0.41  # past 0.9 lease since the renewal was sent: the lease ran out
    assert leader.epoch == 1  # no step taken: the term has not ended by a step
    assert value("percolake_is_leader", role=role) == 0
    leader.release()  # a released lease no longer counts
    assert REGISTRY.get_sample_value("percolake_is_leader", {"role": role}) is None

    follower_store = open_store("memory://")
    changes = value("percolake_leader_changes_total")
    other = LeaderLease(follower_store, role, address="b", lease_ms=1000, clock=clock)
    other.step()
    follower = LeaderLease(follower_store, role, address="c", lease_ms=1000, clock=clock)
    follower.step()
    # Leading and following in one process: the role is led here; the epoch is known.
    assert value("percolake_is_leader", role=role) == 1
    other.release()
    follower.step()  # the released row is taken over at once, in a new epoch
    assert follower.valid()
    assert value("percolake_leader_epoch", role=role) == 2
    # The follower saw epochs 1 and 2, the first replica epoch 1: each a change seen.
    assert value("percolake_leader_changes_total") - changes == 3
    follower.release()


def test_gc_passes_are_counted_with_what_they_deleted() -> None:
    """GC metrics (issue 31): passes, versions and entries deleted, pass duration, the
    safe point and its age. Fails before this fix: a pass exported nothing."""
    names = [
        ("percolake_gc_passes_total", {"outcome": "done"}),
        ("percolake_gc_versions_deleted_total", {}),
        ("percolake_gc_entries_deleted_total", {}),
        ("percolake_gc_pass_seconds_count", {}),
    ]
    deltas = Deltas(*names)
    with TransactionManager.embedded("memory://") as tm:
        tm.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
        for i in range(3):
            with tm.begin() as tx:
                tx.put(T, b"row", b"c", b"%d" % i)
        collector = GarbageCollector(
            tm.store, timestamps=tm._rt.timestamps, locks=tm.locks, retention_s=0, grace_ms=0
        )
        report = collector.run_once()
    assert report.versions_deleted >= 2 and report.entries_deleted >= 2
    assert deltas("percolake_gc_passes_total", outcome="done") == 1
    assert deltas("percolake_gc_versions_deleted_total") == report.versions_deleted
    assert deltas("percolake_gc_entries_deleted_total") == report.entries_deleted
    assert deltas("percolake_gc_pass_seconds_count") == 1
    assert value("percolake_gc_safe_point") == report.safe_point
    age = REGISTRY.get_sample_value("percolake_gc_safe_point_age_seconds")
    assert age is not None and 0 <= age < 3600


def test_the_metrics_server_serves_the_registry_and_frees_its_port() -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    server = metrics.MetricsServer("127.0.0.1", 0)
    try:
        assert server.port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"percolake_commits", "percolake_aborts", "percolake_timestamps_served"} <= names
    finally:
        server.close()
        server.close()  # idempotent
    again = metrics.MetricsServer("127.0.0.1", server.port)  # the port was freed
    again.close()


def _commit_with_an_unknown_outcome(tm: TransactionManager) -> None:
    """A commit whose commit point's reply is lost and whose settling fails every time."""
    tm.failpoints.enable(
        fp.BEFORE_COMMIT_POINT, fp.raise_error(lambda: StoreTimeoutError("lost")), times=1
    )
    tm.failpoints.enable(fp.SETTLE_COMMIT, fp.raise_error(lambda: StoreTimeoutError("lost")))
    unknown = tm.begin()
    unknown.put(T, b"u", b"c", b"v")
    with pytest.raises(CommitUnknownError):
        unknown.commit()
    tm.failpoints.disable()
