"""The adaptive backoff of the retry loop (txn._retry, issue 28): the conflict-rate
estimator, the window it sets, and what the loop reports and sleeps. Deterministic:
the clock, the random source and the sleep are injected; nothing sleeps."""

from __future__ import annotations

import math
import random
import threading

import pytest

from txn import CONFLICTS, ConflictRate, RetriesExhaustedError, RetryPolicy, TransactionManager
from txn import run_transaction as run
from txn._retry import MAX_ADAPTIVE_WINDOW_S
from txn.errors import TransactionConflictError

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tm() -> TransactionManager:
    return TransactionManager.embedded("memory://")


def test_the_rate_is_an_average_over_recent_attempts(clock: Clock) -> None:
    est = ConflictRate(weight=0.5, clock=clock)
    assert est.rate == 0.0
    est.record(True)
    assert est.rate == 0.5
    est.record(True)
    assert est.rate == 0.75
    est.record(False)
    assert est.rate == 0.375


def test_an_uncontended_process_keeps_scale_one(clock: Clock) -> None:
    est = ConflictRate(clock=clock)
    for _ in range(1000):
        est.record(False)
    assert est.scale == 1.0 and est.rate == 0.0


def test_conflicts_widen_and_successes_narrow_within_bounds(clock: Clock) -> None:
    est = ConflictRate(target=0.2, step=0.25, max_scale=20.0, clock=clock)
    est.record(True)
    assert est.scale == pytest.approx(math.exp(0.25 * 0.8))
    for _ in range(200):
        est.record(True)
    assert est.scale == pytest.approx(20.0)  # held at max_scale
    est.record(False)
    assert est.scale == pytest.approx(20.0 * math.exp(-0.25 * 0.2))
    for _ in range(1000):
        est.record(False)
    assert est.scale == 1.0  # never below 1


def test_the_scale_rests_where_target_of_attempts_conflict(clock: Clock) -> None:
    est = ConflictRate(target=0.25, step=0.2, clock=clock)
    for _ in range(10):  # away from the floor first
        est.record(True)
    before = est.scale
    for _ in range(40):  # one conflict in four: the target share
        est.record(True)
        for _ in range(3):
            est.record(False)
    assert est.scale == pytest.approx(before)
    for _ in range(40):  # one in two: above it, the window widens
        est.record(True)
        est.record(False)
    assert est.scale > before


def test_the_scale_halves_every_half_life_without_reports(clock: Clock) -> None:
    est = ConflictRate(step=0.5, max_scale=100.0, half_life_s=10.0, clock=clock)
    for _ in range(10):
        est.record(True)
    wide = est.scale
    clock.now += 10.0
    assert est.scale == pytest.approx(wide / 2)
    clock.now += 1000.0
    assert est.scale == 1.0
    clock.now -= 5.0  # a clock going back decays nothing and breaks nothing
    assert est.scale == 1.0


def test_reset_starts_uncontended(clock: Clock) -> None:
    est = ConflictRate(clock=clock)
    for _ in range(20):
        est.record(True)
    est.reset()
    assert (est.scale, est.rate) == (1.0, 0.0)


def test_reports_from_many_threads_are_all_counted(clock: Clock) -> None:
    est = ConflictRate(target=0.5, step=0.001, max_scale=1e9, clock=clock)
    threads = [
        threading.Thread(target=lambda: [est.record(True) for _ in range(2000)]) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # No clamping on the way: the sum of 16,000 steps of 0.0005, whatever the order.
    assert est.scale == pytest.approx(math.exp(16_000 * 0.001 * 0.5))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target": 0.0},
        {"target": 1.0},
        {"step": 0.0},
        {"max_scale": 0.5},
        {"weight": 0.0},
        {"weight": 1.5},
        {"half_life_s": 0.0},
    ],
)
def test_bad_estimators_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConflictRate(**kwargs)


def test_windows_scale_and_stay_bounded() -> None:
    policy = RetryPolicy()  # base 5 ms, cap 0.5 s
    assert policy.window_s(1) == pytest.approx(0.01)  # as before: min(cap, base * 2**n)
    assert policy.window_s(9) == pytest.approx(0.5)
    assert policy.window_s(0) == 0.0  # no pacing without contention
    assert policy.window_s(1, scale=8.0) == pytest.approx(0.08)
    assert policy.window_s(0, scale=8.0) == pytest.approx(0.07)  # (scale - 1) * 2 * base
    assert policy.window_s(9, scale=50.0) == MAX_ADAPTIVE_WINDOW_S  # widening is bounded
    assert policy.window_s(0, scale=1e6) == MAX_ADAPTIVE_WINDOW_S
    assert policy.window_s(10_000) == pytest.approx(0.5)  # no overflow at any attempt
    wide = RetryPolicy(base_s=1.0, cap_s=60.0)
    assert wide.window_s(9, scale=3.0) == 60.0  # a policy's own wider window stays


def test_bad_window_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="attempt"):
        RetryPolicy().window_s(-1)
    with pytest.raises(ValueError, match="scale"):
        RetryPolicy().window_s(1, scale=0.5)


def test_delays_are_full_jitter_within_the_window() -> None:
    policy, rng = RetryPolicy(), random.Random(7)
    for attempt in range(0, 12):
        for scale in (1.0, 3.0, 40.0):
            window = policy.window_s(attempt, scale)
            delays = [policy.delay_s(attempt, scale, rng) for _ in range(200)]
            assert all(0.0 <= d <= window for d in delays)
            if window:
                assert max(delays) > window / 2  # spread over the window, not bunched
    assert policy.delay_s(0, 1.0, rng) == 0.0


def _conflicting(times: int):  # type: ignore[no-untyped-def]
    calls = [0]

    def fn(tx):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] <= times:
            raise TransactionConflictError("synthetic")
        tx.put("t", b"k", b"c", b"v")

    return fn


def test_the_loop_reports_each_attempt_and_backs_off_by_the_scale(
    tm: TransactionManager, clock: Clock
) -> None:
    est = ConflictRate(target=0.2, step=0.25, clock=clock)
    slept: list[float] = []
    policy = RetryPolicy(max_attempts=5)
    run(tm.begin, tm.outcome, _conflicting(3), policy, conflicts=est, sleep=slept.append)
    # Three conflicts then a success: the log of the scale moved 3 * 0.2 - 0.05.
    assert est.scale == pytest.approx(math.exp(3 * 0.2 - 0.05))
    assert len(slept) == 3  # one sleep per conflict, none before the first attempt
    scales = [math.exp(0.2 * n) for n in (1, 2, 3)]
    for attempt, (delay, scale) in enumerate(zip(slept, scales, strict=True), start=1):
        assert 0.0 <= delay <= policy.window_s(attempt, scale)


def test_a_contended_process_paces_new_transactions(tm: TransactionManager, clock: Clock) -> None:
    est = ConflictRate(clock=clock)
    for _ in range(30):
        est.record(True)
    scale, slept = est.scale, []
    run(
        tm.begin,
        tm.outcome,
        _conflicting(0),
        RetryPolicy(),
        conflicts=est,
        sleep=slept.append,
        rng=random.Random(1),
    )
    assert scale > 1 and len(slept) == 1  # paced once, before its first attempt
    assert 0.0 < slept[0] <= RetryPolicy().window_s(0, scale)


def test_an_uncontended_transaction_never_sleeps(tm: TransactionManager, clock: Clock) -> None:
    est = ConflictRate(clock=clock)
    slept: list[float] = []
    for _ in range(20):
        run(tm.begin, tm.outcome, _conflicting(0), RetryPolicy(), conflicts=est, sleep=slept.append)
    assert slept == [] and est.scale == 1.0


def test_a_fixed_policy_neither_reports_nor_widens(tm: TransactionManager, clock: Clock) -> None:
    est = ConflictRate(clock=clock)
    slept: list[float] = []
    policy = RetryPolicy(max_attempts=4, adaptive=False)
    run(tm.begin, tm.outcome, _conflicting(3), policy, conflicts=est, sleep=slept.append)
    assert est.scale == 1.0 and est.rate == 0.0
    assert all(d <= policy.window_s(n) for n, d in enumerate(slept, start=1))


def test_giving_up_names_the_recent_conflict_rate(tm: TransactionManager, clock: Clock) -> None:
    est = ConflictRate(weight=1.0, clock=clock)
    with pytest.raises(RetriesExhaustedError, match="recent conflict rate 100%") as raised:
        run(
            tm.begin,
            tm.outcome,
            _conflicting(99),
            RetryPolicy(max_attempts=3),
            conflicts=est,
            sleep=lambda _: None,
        )
    assert raised.value.attempts == 3


def test_the_process_estimator_is_the_default() -> None:
    assert isinstance(CONFLICTS, ConflictRate)
    assert RetryPolicy().adaptive and RetryPolicy().max_attempts == 10
