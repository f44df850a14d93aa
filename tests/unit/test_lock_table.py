"""The lock table: all-or-nothing batches, leases, FIFO fairness, epochs."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from lockserver import LockTable, LockTableClosedError, LockToken, StaleTokenError
from percolake.serve.replica import ControlPlane
from storage_adapters import open_store
from tso import LEADER_TABLE, LeaseRecord
from wire.errors import ServiceUnavailableError

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_lock_is_exclusive_until_unlocked() -> None:
    table = LockTable()
    token = table.lock([b"a", b"b"], "t1", lease_ms=60_000)
    assert token is not None
    assert table.lock([b"b"], "t2", lease_ms=1000, wait_timeout_ms=0) is None
    assert table.holder(b"a") == "t1"
    assert table.unlock(token)
    assert table.holder(b"a") is None
    assert table.lock([b"b"], "t2", lease_ms=1000) is not None


def test_batch_is_all_or_nothing() -> None:
    table = LockTable()
    assert table.lock([b"b"], "t1", lease_ms=60_000) is not None
    assert table.lock([b"a", b"b", b"c"], "t2", lease_ms=1000, wait_timeout_ms=20) is None
    # The failed batch holds nothing: a and c are free.
    assert table.holder(b"a") is None and table.holder(b"c") is None
    assert table.lock([b"a", b"c"], "t3", lease_ms=1000) is not None


def test_lease_expiry_frees_the_lock_and_voids_the_token() -> None:
    clock = FakeClock()
    table = LockTable(clock=clock)
    token = table.lock([b"x"], "slow", lease_ms=100)
    assert token is not None
    clock.now += 0.2
    assert table.holder(b"x") is None
    other = table.lock([b"x"], "fast", lease_ms=100)
    assert other is not None
    assert not table.refresh(token)
    assert not table.unlock(token)
    assert table.holder(b"x") == "fast"


def test_refresh_extends_the_lease() -> None:
    clock = FakeClock()
    table = LockTable(clock=clock)
    token = table.lock([b"x"], "t1", lease_ms=100)
    assert token is not None
    for _ in range(5):
        clock.now += 0.08
        assert table.refresh(token)
    assert table.holder(b"x") == "t1"
    assert table.refresh(token, lease_ms=1000)
    clock.now += 0.5
    assert table.holder(b"x") == "t1"


def test_waiter_gets_the_lock_when_the_lease_expires_in_real_time() -> None:
    table = LockTable()
    assert table.lock([b"x"], "dead", lease_ms=50) is not None
    token = table.lock([b"x"], "waiter", lease_ms=1000, wait_timeout_ms=5000)
    assert token is not None and table.holder(b"x") == "waiter"


def test_wait_times_out() -> None:
    table = LockTable()
    assert table.lock([b"x"], "holder", lease_ms=60_000) is not None
    started = time.monotonic()
    assert table.lock([b"x"], "waiter", lease_ms=1000, wait_timeout_ms=50) is None
    assert time.monotonic() - started >= 0.05


def test_waiters_are_served_first_come_first_served() -> None:
    table = LockTable()
    first = table.lock([b"x"], "holder", lease_ms=60_000)
    assert first is not None
    order: list[str] = []
    threads = []
    for i in range(5):

        def wait_turn(name: str = f"w{i}") -> None:
            token = table.lock([b"x"], name, lease_ms=60_000, wait_timeout_ms=10_000)
            assert token is not None
            order.append(name)
            table.unlock(token)

        t = threading.Thread(target=wait_turn)
        t.start()
        threads.append(t)
        while len(table._slots[b"x"].queue) < i + 1:  # queued before the next starts
            time.sleep(0.001)
    table.unlock(first)
    for t in threads:
        t.join()
    assert order == ["w0", "w1", "w2", "w3", "w4"]


def test_overlapping_batches_in_opposite_orders_do_not_deadlock() -> None:
    table = LockTable()
    done: list[str] = []

    def worker(name: str, descriptors: list[bytes]) -> None:
        for _ in range(50):
            token = table.lock(descriptors, name, lease_ms=60_000, wait_timeout_ms=10_000)
            assert token is not None
            table.unlock(token)
        done.append(name)

    a = threading.Thread(target=worker, args=("a", [b"1", b"2", b"3"]))
    b = threading.Thread(target=worker, args=("b", [b"3", b"2", b"1"]))
    a.start()
    b.start()
    a.join(20)
    b.join(20)
    assert sorted(done) == ["a", "b"]


def test_wait_until_released() -> None:
    table = LockTable()
    token = table.lock([b"x"], "writer", lease_ms=60_000)
    assert token is not None
    assert not table.wait_until_released([b"x"], timeout_ms=20)
    threading.Timer(0.05, table.unlock, args=(token,)).start()
    assert table.wait_until_released([b"x", b"y"], timeout_ms=5000)


def test_epoch_changes_on_restart_and_old_tokens_are_rejected() -> None:
    before = LockTable()
    token = before.lock([b"x"], "t1", lease_ms=60_000)
    assert token is not None
    after = LockTable()  # a restarted lock server
    assert after.epoch != before.epoch
    with pytest.raises(StaleTokenError):
        after.refresh(token)
    with pytest.raises(StaleTokenError):
        after.unlock(token)
    assert after.lock([b"x"], "t2", lease_ms=1000) is not None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"descriptors": [b"x"], "owner": "o", "lease_ms": -1}, ValueError),
        ({"descriptors": [b"x"], "owner": "o", "lease_ms": 0}, ValueError),
        ({"descriptors": [b"x"], "owner": "o", "lease_ms": 10**9}, ValueError),
        ({"descriptors": [b"x"], "owner": "o", "lease_ms": 1.5}, TypeError),
        ({"descriptors": [b"x"], "owner": "o", "lease_ms": 10, "wait_timeout_ms": -5}, ValueError),
        ({"descriptors": ["x"], "owner": "o", "lease_ms": 10}, TypeError),
        ({"descriptors": b"x", "owner": "o", "lease_ms": 10}, TypeError),
        ({"descriptors": [], "owner": "o", "lease_ms": 10}, ValueError),
        ({"descriptors": [b""], "owner": "o", "lease_ms": 10}, ValueError),
        ({"descriptors": [b"x"], "owner": "", "lease_ms": 10}, ValueError),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    table = LockTable()
    with pytest.raises(error):
        table.lock(**kwargs)  # type: ignore[arg-type]
    assert len(table) == 0 and table.holder(b"x") is None


def test_refresh_rejects_negative_lease_and_foreign_tokens() -> None:
    table = LockTable()
    token = table.lock([b"x"], "o", lease_ms=1000)
    assert token is not None
    with pytest.raises(ValueError):
        table.refresh(token, lease_ms=-1)
    with pytest.raises(TypeError):
        table.refresh((token.epoch, token.lock_id))  # type: ignore[arg-type]
    assert table.refresh(LockToken(table.epoch, 999_999)) is False


# --- a term's grants end with the term (issue 30, item 14) -----------------------------


def test_a_lock_call_waiting_when_the_term_ends_is_not_granted_in_the_old_table() -> None:
    """Fails before the fix: when a replica's term ended, its lock table was dropped but
    never closed, so a ``lock()`` already waiting in it (behind a holder whose lease
    runs out) was granted there after the term had ended, a token of a table no one
    serves any more. Now the term's end closes the table: the waiting call wakes up,
    is sent on to whoever leads (here: an address that does not answer, so it fails
    as unavailable), and the old table grants nothing."""
    store = open_store("memory://")
    plane = ControlPlane(store, lease_ms=1000, failover_s=1.0)
    plane.lease.address = "127.0.0.1:1"
    plane.lease.step()
    assert plane.lease.valid()
    term = plane._term
    assert term is not None
    holder = plane.lock([b"x"], "holder", lease_ms=300)
    assert holder is not None
    outcome: list[object] = []

    def wait_for_the_lock() -> None:
        try:
            outcome.append(plane.lock([b"x"], "waiter", lease_ms=1000, wait_timeout_ms=3000))
        except Exception as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_for_the_lock)
    waiter.start()
    deadline = time.monotonic() + 5
    while len(term.locks) < 2 and time.monotonic() < deadline:  # the waiter is queued
        time.sleep(0.005)
    # Another replica takes the row (this one was paused, say): the term ends.
    mine = store.get_system(LEADER_TABLE, [b"tso"])[b"tso"]
    other = replace(
        LeaseRecord.decode(mine), epoch=2, holder="other", address="127.0.0.1:2", claimed=False
    )
    assert store.compare_and_set(LEADER_TABLE, b"tso", mine, other.encode()).applied
    plane.lease.step()
    assert not plane.lease.valid()
    waiter.join(timeout=10)
    assert len(outcome) == 1
    assert isinstance(outcome[0], ServiceUnavailableError), outcome
    assert len(term.locks) == 0 and term.locks.closed
    with pytest.raises(LockTableClosedError):
        term.locks.lock([b"y"], "late", lease_ms=1000)
    plane.close()


def test_a_closed_table_wakes_its_waiters_and_refuses_every_call() -> None:
    table = LockTable()
    token = table.lock([b"x"], "holder", lease_ms=60_000)
    assert token is not None
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            table.lock([b"x"], "waiter", lease_ms=1000, wait_timeout_ms=30_000)
        except LockTableClosedError as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while len(table) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    table.close()
    waiter.join(timeout=10)
    assert len(raised) == 1 and not waiter.is_alive()
    for call in (
        lambda: table.refresh(token),
        lambda: table.unlock(token),
        lambda: table.holder(b"x"),
        lambda: table.wait_until_released([b"x"], 10),
    ):
        with pytest.raises(LockTableClosedError):
            call()
    table.close()  # idempotent


def test_a_release_wakes_only_the_first_waiter_of_the_released_descriptor() -> None:
    """Each waiting call is woken only when it may take what it waits for: a release of
    "a" wakes the first of the two calls queued on "a", not the one behind it nor the
    one waiting on "b". (Waking every waiter on every release made each grant cost a
    wake-up of each of dozens of waiters on hot keys.) Counts notifications the table
    sends, so what a woken thread does later cannot change the count."""
    table = LockTable()
    held_a = table.lock([b"a"], "holder-a", lease_ms=60_000)
    held_b = table.lock([b"b"], "holder-b", lease_ms=60_000)
    assert held_a is not None and held_b is not None
    tokens: dict[str, LockToken | None] = {}
    threads: dict[str, threading.Thread] = {}
    for owner, descriptor in (("first-on-a", b"a"), ("second-on-a", b"a"), ("on-b", b"b")):

        def wait(owner: str = owner, descriptor: bytes = descriptor) -> None:
            tokens[owner] = table.lock([descriptor], owner, lease_ms=60_000, wait_timeout_ms=30_000)

        threads[owner] = threading.Thread(target=wait, daemon=True)
        waiting = table.waiter_count()
        threads[owner].start()
        deadline = time.monotonic() + 10
        while table.waiter_count() == waiting:  # queued before the next one starts
            assert time.monotonic() < deadline, f"{owner} did not begin to wait"
            time.sleep(0.001)

    def release_and_join(token: LockToken, woken: str) -> None:
        before = table._notified
        assert table.unlock(token)
        threads[woken].join(10)
        assert tokens.get(woken) is not None, f"{woken} was not granted"
        assert table._notified - before == 1  # only the call that took the lock

    release_and_join(held_a, "first-on-a")
    assert table.waiter_count() == 2
    first = tokens["first-on-a"]
    assert first is not None
    release_and_join(first, "second-on-a")
    assert table.waiter_count() == 1
    release_and_join(held_b, "on-b")
    assert table.waiter_count() == 0
