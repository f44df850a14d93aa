"""The one retry loop: every caller that retries a transaction goes through here.

What counts as retryable is decided once: a :class:`TransactionConflictError`
guarantees the attempt did not commit, so running it again cannot apply it twice.
Nothing else is retried blindly. A :class:`CommitUnknownError` is settled first
(rule S6): the manager is asked for the attempt's outcome with ``settle=True``,
which fences it, so "not committed" then stays true and a retry is safe;
"committed" returns the attempt's result; anything else re-raises the unknown.
Backoff is full jitter (each delay uniform in ``[0, min(cap, base * 2**attempt)]``)
so that writers who collided spread out instead of colliding again.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from txn._api import Transaction
from txn._isolation import Isolation, TransactionStatus
from txn.errors import CommitUnknownError, TransactionConflictError, TransactionError

log = logging.getLogger(__name__)

T = TypeVar("T")
Tx = TypeVar("Tx", bound=Transaction)


class Outcomes(Protocol):
    def __call__(self, txn_id: str, *, settle: bool = False) -> TransactionStatus | None: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to keep retrying conflicts, and how to back off. Units in the names."""

    #: At most this many attempts (``None``: until the deadline).
    max_attempts: int | None = 10
    #: Give up once this long has passed since the first attempt (``None``: no deadline).
    deadline_s: float | None = None
    base_s: float = 0.005
    cap_s: float = 0.5
    #: Settle an unknown commit outcome and retry if it did not commit (needs a
    #: transaction whose effects are safe to re-run once it is known not to have
    #: committed); otherwise the unknown outcome goes to the caller as it is.
    settle_unknown: bool = False
    #: Conflicts of these kinds end the loop at once, even when ``fn`` raised them:
    #: a caller's way to say "what this attempt depended on changed; do not retry".
    give_up_on: tuple[type[TransactionConflictError], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise ValueError(f"max_attempts must be a positive int, got {self.max_attempts!r}")
        if self.max_attempts is None and self.deadline_s is None:
            raise ValueError("a retry policy needs max_attempts or deadline_s")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {self.deadline_s}")
        if not 0 <= self.base_s <= self.cap_s:
            raise ValueError("backoff needs 0 <= base_s <= cap_s")

    def delay_s(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


class RetriesExhaustedError(TransactionConflictError):
    """Every attempt lost to a concurrent transaction; none of them committed."""

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


def run_transaction(
    begin: Callable[[Isolation], Tx],
    outcome: Outcomes,
    fn: Callable[[Tx], T],
    policy: RetryPolicy,
    *,
    isolation: Isolation = Isolation.SNAPSHOT,
    what: str = "transaction",
) -> tuple[T, int | None]:
    """``fn(tx)`` and commit, retried per ``policy``; returns the result and commit_ts.

    ``begin`` and ``outcome`` are a manager's (:class:`txn.Manager`).

    The commit timestamp is ``None`` when the commit's reply was lost and the
    outcome was settled as committed afterwards (the timestamp is not known then).
    ``fn`` raising aborts the attempt; a conflict (from ``fn`` or the commit) is
    retried unless it is one of ``policy.give_up_on``, anything else propagates.
    On giving up, the last conflict is raised as :class:`RetriesExhaustedError`
    (a :class:`TransactionConflictError`).
    """
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        tx = begin(isolation)
        try:
            result = fn(tx)
        except BaseException as exc:
            with contextlib.suppress(TransactionError):  # already ended: nothing to undo
                tx.abort()
            if not isinstance(exc, TransactionConflictError) or isinstance(exc, policy.give_up_on):
                raise
            last: TransactionError = exc
        else:
            try:
                return result, tx.commit()
            except policy.give_up_on:
                raise
            except TransactionConflictError as conflict:
                last = conflict
            except CommitUnknownError as unknown:
                if not policy.settle_unknown:
                    raise
                if _settled_committed(outcome, tx, unknown, what):
                    return result, None
                last = unknown
        if _exhausted(policy, attempt, started):
            raise RetriesExhaustedError(
                f"{what}: lost to concurrent transactions {attempt} times in "
                f"{time.monotonic() - started:.1f} s; nothing was committed",
                attempts=attempt,
            ) from last
        delay = policy.delay_s(attempt)
        log.debug("%s: attempt %d did not commit (%s); again in %.3f s", what, attempt, last, delay)
        time.sleep(delay)


def _settled_committed(
    outcome: Outcomes, tx: Transaction, unknown: CommitUnknownError, what: str
) -> bool:
    """Settle an unknown outcome (S6): ``True`` committed, ``False`` fenced as not."""
    try:
        status = outcome(tx.id, settle=True)
    except Exception as exc:
        log.warning("%s: could not settle an unknown commit: %s", what, exc)
        raise unknown from exc
    if status is TransactionStatus.COMMITTED:
        log.info("%s: unknown commit outcome settled as committed", what)
        return True
    if status is TransactionStatus.ABORTED:
        log.info("%s: unknown commit outcome settled as not committed; retrying", what)
        return False
    raise unknown


def _exhausted(policy: RetryPolicy, attempt: int, started: float) -> bool:
    if policy.max_attempts is not None and attempt >= policy.max_attempts:
        return True
    return policy.deadline_s is not None and time.monotonic() - started >= policy.deadline_s
