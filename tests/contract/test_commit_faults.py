"""Faults in the commit path: each may cost an abort, never an anomaly (rules S3-S6)."""

from __future__ import annotations

import threading

import pytest

from lockserver import LockTable
from storage_adapters import StoreError, StoreTimeoutError, StoreUnavailableError
from txn import TransactionManager, TransactionStatus
from txn import failpoints as fp
from txn.errors import CommitUnknownError, TransactionConflictError
from txn.tables import ABORTED

pytestmark = pytest.mark.contract

T = "t"
C = b"c"


def value(tm: TransactionManager, row: bytes) -> bytes | None:
    return tm.begin().get(T, row, C)


def test_paused_committer_whose_locks_expired_is_aborted_by_a_reader(
    tm: TransactionManager,
) -> None:
    """S5: the pause AtlasDB is exposed to. The reader settles it; its commit then fails."""
    resume, reached = threading.Event(), threading.Event()
    writer = tm.begin()
    writer.put(T, b"a", C, b"paused")
    tm.failpoints.enable(
        fp.BEFORE_COMMIT_POINT, fp.pause(30, until=resume, reached=reached), times=1
    )
    outcome: list[BaseException | int] = []

    def commit() -> None:
        try:
            outcome.append(writer.commit())
        except BaseException as exc:
            outcome.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    assert reached.wait(10)
    tm.replace_locks(LockTable())  # its lease is gone, as after expiry or a restart
    assert value(tm, b"a") is None  # the reader does not wait forever, and sees nothing
    resume.set()
    committer.join(10)
    assert isinstance(outcome[0], TransactionConflictError)
    assert writer.status is TransactionStatus.ABORTED
    assert value(tm, b"a") is None


def test_reader_waits_for_a_live_committer_instead_of_aborting_it(
    tm: TransactionManager,
) -> None:
    resume, reached = threading.Event(), threading.Event()
    writer = tm.begin()
    writer.put(T, b"a", C, b"committed")
    tm.failpoints.enable(fp.AFTER_COMMIT_TS, fp.pause(10, until=resume, reached=reached), times=1)
    committer = threading.Thread(target=writer.commit)
    committer.start()
    assert reached.wait(10)
    reader = tm.begin()  # started after the writer took its commit timestamp
    threading.Timer(0.1, resume.set).start()
    assert reader.get(T, b"a", C) == b"committed"
    committer.join(10)
    assert writer.status is TransactionStatus.COMMITTED


def test_lock_server_restart_between_any_two_steps_costs_no_anomaly(
    tm: TransactionManager,
) -> None:
    for point in (fp.AFTER_LOCK, fp.AFTER_WRITE, fp.AFTER_CONFLICT_CHECK, fp.AFTER_COMMIT_TS):
        with tm.begin() as tx:
            tx.put(T, b"n", C, b"0")
        t1, t2 = tm.begin(), tm.begin()
        t1.put(T, b"n", C, b"1")
        t2.put(T, b"n", C, b"2")
        tm.failpoints.enable(point, lambda _ts: tm.replace_locks(LockTable()), times=1)
        t1.commit()
        with pytest.raises(TransactionConflictError):
            t2.commit()
        assert value(tm, b"n") == b"1"


def test_timed_out_commit_point_that_applied_is_settled_as_committed(
    tm: TransactionManager,
) -> None:
    tx = tm.begin()
    tx.put(T, b"a", C, b"1")
    tm.failpoints.enable(
        fp.AFTER_COMMIT_POINT, fp.raise_error(lambda: StoreTimeoutError("lost reply")), times=1
    )
    commit_ts = tx.commit()
    assert tx.status is TransactionStatus.COMMITTED and commit_ts > tx.start_ts
    assert value(tm, b"a") == b"1"


def test_timed_out_commit_point_that_did_not_apply_is_settled_by_reissuing(
    tm: TransactionManager,
) -> None:
    tx = tm.begin()
    tx.put(T, b"a", C, b"1")
    tm.failpoints.enable(
        fp.BEFORE_COMMIT_POINT, fp.raise_error(lambda: StoreTimeoutError("timeout")), times=1
    )
    tx.commit()
    assert value(tm, b"a") == b"1"


def test_unsettleable_commit_point_raises_commit_unknown(tm: TransactionManager) -> None:
    tx = tm.begin()
    tx.put(T, b"a", C, b"1")
    tm.failpoints.enable(
        fp.AFTER_COMMIT_POINT, fp.raise_error(lambda: StoreTimeoutError("lost reply")), times=1
    )
    tm.failpoints.enable(fp.SETTLE_COMMIT, fp.raise_error(lambda: StoreTimeoutError("down")))
    with pytest.raises(CommitUnknownError) as info:
        tx.commit()
    assert info.value.start_ts == tx.start_ts
    assert tx.status is TransactionStatus.UNKNOWN
    tm.failpoints.disable()
    # It did apply: readers find it committed, never "aborted by absence" (S3).
    assert value(tm, b"a") == b"1"


def test_crash_after_the_commit_point_is_committed(tm: TransactionManager) -> None:
    tx = tm.begin()
    tx.put(T, b"a", C, b"1")
    tm.failpoints.enable(fp.AFTER_COMMIT_POINT, fp.crash(), times=1)
    with pytest.raises(fp.SimulatedCrash):
        tx.commit()
    assert value(tm, b"a") == b"1"  # its locks are still held: readers check the entry first


@pytest.mark.parametrize(
    "point", [fp.AFTER_LOCK, fp.AFTER_WRITE, fp.AFTER_CONFLICT_CHECK, fp.BEFORE_COMMIT_POINT]
)
def test_crash_before_the_commit_point_leaves_nothing_visible(
    tm: TransactionManager, point: str
) -> None:
    tx = tm.begin()
    tx.put(T, b"a", C, b"1")
    tx.put(T, b"b", C, b"1")
    tm.failpoints.enable(point, fp.crash(), times=1)
    with pytest.raises(fp.SimulatedCrash):
        tx.commit()
    tm.replace_locks(LockTable())  # the process died: its locks went with it
    reader = tm.begin()
    assert reader.get_many(T, [(b"a", C), (b"b", C)]) == {}
    assert list(reader.scan(T)) == []
    # A later writer of the same cells is not blocked by the garbage.
    with tm.begin() as again:
        again.put(T, b"a", C, b"2")
    assert value(tm, b"a") == b"2"


def test_aborted_writers_versions_are_cleaned_up(tm: TransactionManager) -> None:
    with tm.begin() as tx:
        tx.put(T, b"a", C, b"0")
    t1, t2 = tm.begin(), tm.begin()
    t1.put(T, b"a", C, b"1")
    t2.put(T, b"a", C, b"2")
    t2.put(T, b"b", C, b"2")
    t1.commit()
    with pytest.raises(TransactionConflictError):
        t2.commit()
    tm.wait_for_cleanup()
    left = tm.store.get_version_timestamps(T, [(b"a", C), (b"b", C)])
    assert all(t2.start_ts not in tss for tss in left.values())
    assert tm._rt.resolver.read([t2.start_ts]) == {t2.start_ts: ABORTED}


@pytest.mark.parametrize("error", [StoreUnavailableError, StoreError])
def test_unavailable_after_the_commit_point_applied_is_settled_not_aborted(
    tm: TransactionManager, error: type[StoreError]
) -> None:
    """Issue 12, hole 6; failed before the fix.

    With Cassandra's Paxos v1 the commit LWT can raise Unavailable after a quorum
    accepted the proposal, and a later Paxos round completes it. The committer took
    every store error but a timeout as "definitely aborted": it answered
    ``TransactionAbortedError`` (and queued its versions for clean-up) while the
    transactions table said committed.
    """
    tx = tm.begin()
    tx.put(T, b"a", C, b"1")
    tm.failpoints.enable(
        fp.AFTER_COMMIT_POINT, fp.raise_error(lambda: error("Unavailable after accept")), times=1
    )
    commit_ts = tx.commit()
    assert tx.status is TransactionStatus.COMMITTED and commit_ts > tx.start_ts
    assert value(tm, b"a") == b"1"
    assert tm.outcome(tx.id) is TransactionStatus.COMMITTED


def test_unavailable_before_the_commit_point_is_settled_by_reissuing(
    tm: TransactionManager,
) -> None:
    """An error that may come before or after the proposal is settled the same way."""
    tx = tm.begin()
    tx.put(T, b"a", C, b"1")
    tm.failpoints.enable(
        fp.BEFORE_COMMIT_POINT,
        fp.raise_error(lambda: StoreUnavailableError("Unavailable")),
        times=1,
    )
    tx.commit()
    assert value(tm, b"a") == b"1"
