"""The one retry loop (txn._retry): what is retried, what is settled, when it gives up."""

from __future__ import annotations

import pytest

from storage_adapters import StoreTimeoutError
from txn import (
    Isolation,
    RetriesExhaustedError,
    RetryPolicy,
    TransactionManager,
    TransactionStatus,
    run_transaction,
)
from txn import failpoints as fp
from txn.errors import CommitUnknownError, TransactionConflictError

pytestmark = pytest.mark.unit

T = "t"
C = b"c"


class StopHere(TransactionConflictError):
    """A conflict the caller declares final (as the lakehouse's concurrent overwrite)."""


@pytest.fixture
def tm() -> TransactionManager:
    return TransactionManager.embedded("memory://")


def _put(value: bytes):  # type: ignore[no-untyped-def]
    def fn(tx):  # type: ignore[no-untyped-def]
        tx.put(T, b"k", C, value)
        return value

    return fn


def _unknown_commit_point(tm: TransactionManager, *, applied: bool) -> None:
    """The next commit point's outcome is lost (applied or not): CommitUnknownError."""
    point = fp.AFTER_COMMIT_POINT if applied else fp.BEFORE_COMMIT_POINT
    tm.failpoints.enable(point, fp.raise_error(lambda: StoreTimeoutError("lost")), times=1)
    tm.failpoints.enable(
        fp.SETTLE_COMMIT, fp.raise_error(lambda: StoreTimeoutError("still lost")), times=5
    )


def test_an_unknown_outcome_that_applied_is_settled_as_committed(tm: TransactionManager) -> None:
    _unknown_commit_point(tm, applied=True)
    policy = RetryPolicy(max_attempts=3, settle_unknown=True)
    result, commit_ts = run_transaction(tm.begin, tm.outcome, _put(b"1"), policy)
    assert (result, commit_ts) == (b"1", None)  # committed; its timestamp is not known
    assert tm.begin().get(T, b"k", C) == b"1"


def test_an_unknown_outcome_that_did_not_apply_is_fenced_then_retried(
    tm: TransactionManager,
) -> None:
    _unknown_commit_point(tm, applied=False)
    attempts: list[int] = []

    def fn(tx):  # type: ignore[no-untyped-def]
        attempts.append(tx.start_ts)
        tx.put(T, b"k", C, b"2")

    policy = RetryPolicy(max_attempts=3, settle_unknown=True)
    _, commit_ts = run_transaction(tm.begin, tm.outcome, fn, policy)
    assert len(attempts) == 2 and commit_ts is not None
    assert tm.outcome(str(attempts[0])) is TransactionStatus.ABORTED  # fenced for good


def test_an_unknown_outcome_is_not_settled_unless_asked(tm: TransactionManager) -> None:
    _unknown_commit_point(tm, applied=True)
    with pytest.raises(CommitUnknownError):
        run_transaction(tm.begin, tm.outcome, _put(b"1"), RetryPolicy(max_attempts=3))


def test_an_unsettleable_outcome_stays_unknown(tm: TransactionManager) -> None:
    _unknown_commit_point(tm, applied=True)

    def broken_outcome(txn_id: str, *, settle: bool = False) -> TransactionStatus | None:
        raise StoreTimeoutError("the store is gone")

    policy = RetryPolicy(max_attempts=3, settle_unknown=True)
    with pytest.raises(CommitUnknownError):
        run_transaction(tm.begin, broken_outcome, _put(b"1"), policy)


def test_gives_up_after_the_deadline_with_a_conflict(tm: TransactionManager) -> None:
    def always(tx):  # type: ignore[no-untyped-def]
        raise TransactionConflictError("synthetic")

    policy = RetryPolicy(max_attempts=None, deadline_s=0.05, base_s=0.001, cap_s=0.002)
    with pytest.raises(RetriesExhaustedError) as raised:
        run_transaction(tm.begin, tm.outcome, always, policy, isolation=Isolation.SERIALIZABLE)
    assert raised.value.attempts >= 2


def test_a_conflict_the_caller_declares_final_is_not_retried(tm: TransactionManager) -> None:
    attempts: list[int] = []

    def fn(tx):  # type: ignore[no-untyped-def]
        attempts.append(1)
        raise StopHere("the table moved")

    policy = RetryPolicy(max_attempts=5, give_up_on=(StopHere,))
    with pytest.raises(StopHere):
        run_transaction(tm.begin, tm.outcome, fn, policy)
    assert attempts == [1]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": None, "deadline_s": None},
        {"deadline_s": -1.0},
        {"base_s": 1.0, "cap_s": 0.5},
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
