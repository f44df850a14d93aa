"""The one retry loop: every caller that retries a transaction goes through here.

What counts as retryable is decided once: a :class:`TransactionConflictError`
guarantees the attempt did not commit, so running it again cannot apply it twice.
Nothing else is retried blindly. A :class:`CommitUnknownError` is settled first
(rule S6): the manager is asked for the attempt's outcome with ``settle=True``,
which fences it, so "not committed" then stays true and a retry is safe;
"committed" returns the attempt's result; anything else re-raises the unknown.
Backoff is full jitter (each delay uniform in ``[0, window]``) so that writers who
collided spread out instead of colliding again, and the window adapts to contention
through a process-wide :class:`ConflictRate` (:data:`CONFLICTS`) that every attempt
reports to: after the n-th conflict the window is ``scale * min(cap, base * 2**n)``,
and a new transaction waits ``(scale - 1) * min(cap, 2 * base)`` at most before its
first attempt (nothing at scale 1); widening stops at :data:`MAX_ADAPTIVE_WINDOW_S`.

Why adapt: how wide the window must be depends on how many writers share a hot cell
and how long an attempt takes, which the loop cannot know in advance. With the fixed
5 ms to 0.5 s window, 64 clients on 4 counters through a gateway (issue 28) lost ten
times in a row by the dozen; a window that wide from the start would slow a lightly
contended workload. The scale is an integral controller on the share of attempts that
conflicted: each conflict widens it, each success narrows it, in proportions that
settle where ``target`` (20 %) of attempts conflict; at that rate ten attempts in a
row all lose with a probability of about 1e-7.

Why new transactions wait too: the writer that just won starts its next transaction
at once, so without pacing a hot cell is always busy with someone's first attempt,
and a retry, however late, finds it so (measured: retries lost about 70 % of the time
whatever the window). Pacing leaves gaps in which retries can win.

What it costs: an uncontended process has no conflicts, so its scale stays 1 and
nothing sleeps, as before. The scale also decays with time, halving every
``half_life_s`` (slow next to the reports of a contended process), so contention long
past does not delay later work. One estimator per process (not per
cell: the loop does not know the cells): a process whose hot cells are a small share
of its transactions sees a low conflict rate and widens little (its retries still
spread by ``2**n``); one whose transactions mostly contend paces them all, which is
what spares them their retries. Policies with ``adaptive=False`` keep the fixed
window and report nothing (the lakehouse engine: one gateway process serves every
table, so one table's contention must not pace another's).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
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


#: Doublings of ``base_s`` past which the window is the cap anyway (2**62 * 1 ns > 4e9 s).
_MAX_DOUBLINGS = 62
_RANDOM = random.Random()
#: The adaptive scale widens a window up to this (seconds).
MAX_ADAPTIVE_WINDOW_S = 5.0


class ConflictRate:
    """The share of recent attempts that lost to a concurrent transaction, and the
    backoff scale it sets; thread-safe, one per process (:data:`CONFLICTS`).

    ``rate`` is an exponentially weighted average over attempts (``weight`` per
    attempt: about the last ``1 / weight`` attempts count). ``scale`` multiplies the
    backoff window: its logarithm grows by ``step * (1 - target)`` on a conflict and
    shrinks by ``step * target`` on a success, so it climbs while more than
    ``target`` of attempts conflict and falls while fewer do, and rests where the
    backoff spreads writers just enough (an integral controller: a scale read off the
    rate alone would rest where the rate is still high, as a wide window is what keeps
    it low). It stays within ``[1, max_scale]`` and also decays with time, halving
    every ``half_life_s``: when reports stop, the window falls back. ``clock`` is
    injectable for tests.

    ``rate`` is what the loop reports (the out-of-retries error, its debug log, the
    benchmarks); ``scale`` is what it acts on. The default ``max_scale`` of 200 lets
    the pacing window of the default policy reach about 2 s: what 16 writers on one
    cell through a loaded gateway needed (``bench.bench_hotkeys``, 64 clients on 4
    counters, settled at scales of 50 to 150).
    """

    def __init__(
        self,
        *,
        target: float = 0.2,
        step: float = 0.25,
        max_scale: float = 200.0,
        weight: float = 0.1,
        half_life_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < target < 1:
            raise ValueError(f"target must be in (0, 1), got {target}")
        if not step > 0:
            raise ValueError(f"step must be positive, got {step}")
        if not max_scale >= 1:
            raise ValueError(f"max_scale must be at least 1, got {max_scale}")
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s}")
        self.target = target
        self.step = step
        self.max_scale = max_scale
        self.weight = weight
        self.half_life_s = half_life_s
        self._clock = clock
        self._guard = threading.Lock()
        self._rate = 0.0
        self._log_scale = 0.0
        self._at = clock()

    def record(self, conflicted: bool) -> None:
        """One attempt's result: it lost to a concurrent transaction, or it did not."""
        hit = 1.0 if conflicted else 0.0
        with self._guard:
            self._decay()
            self._rate += self.weight * (hit - self._rate)
            self._log_scale += self.step * (hit - self.target)
            self._log_scale = min(max(self._log_scale, 0.0), math.log(self.max_scale))

    @property
    def rate(self) -> float:
        with self._guard:
            return self._rate

    @property
    def scale(self) -> float:
        with self._guard:
            self._decay()
            return math.exp(self._log_scale)

    def reset(self) -> None:
        """Back to an uncontended start (rate 0, scale 1)."""
        with self._guard:
            self._rate, self._log_scale, self._at = 0.0, 0.0, self._clock()

    def _decay(self) -> None:
        now = self._clock()
        idle = max(0.0, now - self._at)
        self._at = now
        if idle and self._log_scale:
            self._log_scale = max(0.0, self._log_scale - math.log(2) * idle / self.half_life_s)


#: The process's estimator: every retry loop reports to it and backs off by its scale.
CONFLICTS = ConflictRate()


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
    #: Widen the backoff window by the process's conflict rate (:class:`ConflictRate`)
    #: and report every attempt to it; ``False``: the fixed window, nothing reported.
    adaptive: bool = True

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

    def window_s(self, attempt: int, scale: float = 1.0) -> float:
        """The widest delay before attempt ``attempt + 1`` at backoff ``scale``.

        After a conflict (``attempt >= 1``): ``scale * min(cap_s, base_s * 2**attempt)``.
        Before the first attempt (``attempt == 0``): ``(scale - 1) * min(cap_s, 2 *
        base_s)``, nothing at scale 1. Widening never goes past
        :data:`MAX_ADAPTIVE_WINDOW_S` (a window the policy itself sets wider stays).
        """
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        if scale < 1:
            raise ValueError(f"scale must be >= 1, got {scale}")
        # 2**attempt is bounded: deadline policies may reach thousands of attempts.
        doubled: float = self.base_s * 2.0 ** min(max(attempt, 1), _MAX_DOUBLINGS)
        fixed = min(self.cap_s, doubled)
        if attempt == 0:
            return min((scale - 1) * fixed, MAX_ADAPTIVE_WINDOW_S)
        return min(scale * fixed, max(fixed, MAX_ADAPTIVE_WINDOW_S))

    def delay_s(self, attempt: int, scale: float = 1.0, rng: random.Random | None = None) -> float:
        """Full jitter: uniform in ``[0, window_s(attempt, scale)]``."""
        window = self.window_s(attempt, scale)
        return (rng or _RANDOM).uniform(0, window) if window else 0.0


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
    conflicts: ConflictRate | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> tuple[T, int | None]:
    """``fn(tx)`` and commit, retried per ``policy``; returns the result and commit_ts.

    ``begin`` and ``outcome`` are a manager's (:class:`txn.Manager`).

    The commit timestamp is ``None`` when the commit's reply was lost and the
    outcome was settled as committed afterwards (the timestamp is not known then).
    ``fn`` raising aborts the attempt; a conflict (from ``fn`` or the commit) is
    retried unless it is one of ``policy.give_up_on``, anything else propagates.
    On giving up, the last conflict is raised as :class:`RetriesExhaustedError`
    (a :class:`TransactionConflictError`).

    With ``policy.adaptive`` every attempt that committed or conflicted is reported
    to ``conflicts`` (default: the process's :data:`CONFLICTS`), whose scale widens
    the backoff; ``sleep`` and ``rng`` are injectable for tests.
    """
    estimator = (conflicts or CONFLICTS) if policy.adaptive else None
    started = time.monotonic()
    attempt = 0
    if estimator is not None:
        # Pacing: in a contended process a new transaction waits too, or the writers
        # that just won would keep a hot cell busy and every retry would find it so.
        pace = policy.delay_s(0, estimator.scale, rng)
        if pace:
            sleep(pace)
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
            _report(estimator, conflicted=True)
        else:
            try:
                commit_ts = tx.commit()
            except policy.give_up_on:
                raise
            except TransactionConflictError as conflict:
                last = conflict
                _report(estimator, conflicted=True)
            except CommitUnknownError as unknown:
                if not policy.settle_unknown:
                    raise
                if _settled_committed(outcome, tx, unknown, what):
                    return result, None
                last = unknown
            else:
                _report(estimator, conflicted=False)
                return result, commit_ts
        if _exhausted(policy, attempt, started):
            rate = f", recent conflict rate {estimator.rate:.0%}" if estimator else ""
            raise RetriesExhaustedError(
                f"{what}: lost to concurrent transactions {attempt} times in "
                f"{time.monotonic() - started:.1f} s{rate}; nothing was committed",
                attempts=attempt,
            ) from last
        scale = estimator.scale if estimator else 1.0
        delay = policy.delay_s(attempt, scale, rng)
        log.debug(
            "%s: attempt %d did not commit (%s); again in %.3f s (backoff scale %.1f)",
            what,
            attempt,
            last,
            delay,
            scale,
        )
        sleep(delay)


def _report(estimator: ConflictRate | None, *, conflicted: bool) -> None:
    if estimator is not None:
        estimator.record(conflicted)


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
