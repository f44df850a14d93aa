"""The lock table as a queue for pessimistic transactions: locks reentrant per owner,
deadlocks found in the wait-for graph between owners (exactly one victim per cycle),
and waits that can be seen (``LockTable.waits`` and the lock metrics).

Waiting calls run in threads; a test waits (bounded) until they stand in the queue
before it acts, and joins them with a bound, so nothing here depends on timing."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from prometheus_client import REGISTRY

from lockserver import LockTable, LockTableClosedError, LockToken, render_descriptor
from lockserver.lock_service import LockServicer, RemoteLockService
from percolake.serve.replica import ControlPlane
from percolake.serve.status import ControlServicer
from storage_adapters import open_store
from wire.channels import Connection
from wire.errors import DeadlockError, TransactionConflictError
from wire.v1 import control_pb2 as pb
from wire.v1 import lock_pb2_grpc

pytestmark = pytest.mark.unit

LONG_MS = 30_000
JOIN_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Call:
    """One ``lock`` call in a thread of its own: its token, or what it raised."""

    def __init__(
        self,
        table: LockTable | ControlPlane | RemoteLockService,
        descriptors: list[bytes],
        owner: str,
        wait_ms: int = LONG_MS,
        priority: int | None = None,
    ) -> None:
        self.token: LockToken | None = None
        self.error: BaseException | None = None
        self.returned = threading.Event()

        def run() -> None:
            try:
                self.token = table.lock(
                    descriptors, owner, lease_ms=60_000, wait_timeout_ms=wait_ms, priority=priority
                )
            except BaseException as exc:  # reported to the test, which asserts on it
                self.error = exc
            finally:
                self.returned.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> LockToken | None:
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "the lock call did not return"
        if self.error is not None:
            raise self.error
        return self.token


def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) for a state other threads reach."""
    deadline = time.monotonic() + JOIN_S
    while not condition():
        assert time.monotonic() < deadline, "the state was not reached"
        time.sleep(0.002)


def waiters(table: LockTable, count: int) -> None:
    until(lambda: table.waiter_count() == count)


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def take(table: LockTable, descriptors: list[bytes], owner: str) -> LockToken:
    token = table.lock(descriptors, owner, lease_ms=60_000)
    assert token is not None
    return token


# --- reentrancy -------------------------------------------------------------------------


def test_an_owner_locks_what_it_holds_again_at_once_with_a_token_per_grant() -> None:
    table = LockTable()
    first = take(table, [b"x"], "1")
    second = table.lock([b"x", b"y"], "1", lease_ms=60_000, wait_timeout_ms=0)
    assert second is not None and second != first
    assert table.holder(b"x") == "1" and table.holder(b"y") == "1"
    # Another owner still cannot have it.
    assert table.lock([b"x"], "2", lease_ms=1000, wait_timeout_ms=0) is None


def test_a_descriptor_stays_held_until_every_grant_of_its_owner_is_released() -> None:
    table = LockTable()
    first = take(table, [b"x"], "1")
    second = take(table, [b"x"], "1")
    assert table.unlock(first)
    assert table.holder(b"x") == "1"
    assert not table.unlock(first)  # a token releases its own grant, once
    assert table.refresh(second)
    assert table.unlock(second)
    assert table.holder(b"x") is None


def test_a_reentrant_call_bypasses_the_queue_and_the_waiter_gets_the_lock_after_both() -> None:
    table = LockTable()
    first = take(table, [b"x"], "1")
    waiter = Call(table, [b"x"], "2")
    waiters(table, 1)
    # "1" would wait behind "2", which waits for "1", if it queued.
    second = table.lock([b"x"], "1", lease_ms=60_000, wait_timeout_ms=0)
    assert second is not None
    assert table.unlock(first)
    assert table.holder(b"x") == "1" and not waiter.returned.is_set()
    assert table.unlock(second)
    assert waiter.result() is not None
    assert table.holder(b"x") == "2"


def test_one_grant_of_an_owner_expires_and_the_other_keeps_the_descriptor() -> None:
    clock = FakeClock()
    table = LockTable(clock=clock)
    short = table.lock([b"x"], "1", lease_ms=100)
    long = table.lock([b"x"], "1", lease_ms=1000)
    assert short is not None and long is not None
    clock.now += 0.2
    assert table.holder(b"x") == "1"
    assert not table.refresh(short)
    assert table.lock([b"x"], "2", lease_ms=100) is None
    clock.now += 1.0
    assert table.holder(b"x") is None
    assert not table.refresh(long)
    assert table.lock([b"x"], "2", lease_ms=100) is not None


def test_a_waiting_reentrant_call_is_granted_when_its_owner_takes_the_lock() -> None:
    """A call of "2" queued behind "1"'s lock; "2" then gets it through another grant:
    the queued call takes it too, out of turn, though "3" stands ahead of it."""
    table = LockTable()
    held = take(table, [b"x"], "1")
    first_of_2 = Call(table, [b"x"], "2")
    waiters(table, 1)
    third = Call(table, [b"x"], "3")
    waiters(table, 2)
    second_of_2 = Call(table, [b"x"], "2")
    waiters(table, 3)
    assert table.unlock(held)
    assert first_of_2.result() is not None
    assert second_of_2.result() is not None
    assert table.holder(b"x") == "2" and not third.returned.is_set()
    table.close()
    with pytest.raises(LockTableClosedError):
        third.result()


# --- deadlocks --------------------------------------------------------------------------


def test_two_owners_crossing_on_two_descriptors_one_is_the_victim_the_other_proceeds() -> None:
    table = LockTable()
    deadlocks = sample("percolake_lock_deadlocks_total")
    take(table, [b"a"], "1")
    b_of_2 = take(table, [b"b"], "2")
    one = Call(table, [b"b"], "1")
    waiters(table, 1)
    with pytest.raises(DeadlockError) as raised:
        table.lock([b"a"], "2", lease_ms=60_000, wait_timeout_ms=LONG_MS)
    error = raised.value
    assert isinstance(error, TransactionConflictError) and error.reason == "deadlock"
    text = str(error)
    assert "2 waits for 1 on 'a'" in text and "1 waits for 2 on 'b'" in text, text
    assert sample("percolake_lock_deadlocks_total") - deadlocks == 1
    # Only the victim's call gave up: "2" still holds b, "1" still waits for it.
    assert table.holder(b"b") == "2" and table.waiter_count() == 1
    assert not one.returned.is_set()
    # The victim's transaction aborts and releases the rest; the other proceeds.
    assert table.unlock(b_of_2)
    assert one.result() is not None
    assert table.holder(b"b") == "1"
    assert sample("percolake_lock_deadlocks_total") - deadlocks == 1


def test_the_victim_releases_what_its_call_acquired_so_far() -> None:
    table = LockTable()
    take(table, [b"b"], "1")
    d_of_2 = take(table, [b"d"], "2")
    one = Call(table, [b"d"], "1")
    waiters(table, 1)
    # "2" takes a at once, then would wait on b for "1", which waits for "2".
    with pytest.raises(DeadlockError):
        table.lock([b"a", b"b"], "2", lease_ms=60_000, wait_timeout_ms=LONG_MS)
    assert table.holder(b"a") is None
    assert table.holder(b"d") == "2"
    assert table.unlock(d_of_2)
    assert one.result() is not None


def test_a_batch_that_waited_for_one_descriptor_checks_again_at_the_next() -> None:
    """ "2"'s batch waits for a (held by "3", who waits for nothing), then takes it and
    would wait for b, held by "1", who meanwhile waits for d, held by "2"."""
    table = LockTable()
    d_of_2 = take(table, [b"d"], "2")
    take(table, [b"b"], "1")
    a_of_3 = take(table, [b"a"], "3")
    batch = Call(table, [b"a", b"b"], "2")
    waiters(table, 1)
    one = Call(table, [b"d"], "1")
    waiters(table, 2)
    assert table.unlock(a_of_3)
    with pytest.raises(DeadlockError) as raised:
        batch.result()
    assert "2 waits for 1 on 'b'" in str(raised.value), raised.value
    assert table.holder(b"a") is None  # what the batch took is free again
    assert table.unlock(d_of_2)
    assert one.result() is not None


def test_a_three_owner_cycle_has_one_victim_and_unwinds() -> None:
    table = LockTable()
    a_of_1 = take(table, [b"a"], "1")
    b_of_2 = take(table, [b"b"], "2")
    c_of_3 = take(table, [b"c"], "3")
    one = Call(table, [b"b"], "1")
    waiters(table, 1)
    two = Call(table, [b"c"], "2")
    waiters(table, 2)
    with pytest.raises(DeadlockError) as raised:
        table.lock([b"a"], "3", lease_ms=60_000, wait_timeout_ms=LONG_MS)
    text = str(raised.value)
    for edge in ("3 waits for 1 on 'a'", "1 waits for 2 on 'b'", "2 waits for 3 on 'c'"):
        assert edge in text, text
    assert not one.returned.is_set() and not two.returned.is_set()
    assert table.unlock(c_of_3)  # the victim aborts
    c_of_2 = two.result()
    assert c_of_2 is not None
    assert table.unlock(c_of_2) and table.unlock(b_of_2)
    assert one.result() is not None
    assert table.unlock(a_of_1)


def test_a_cycle_through_a_waiter_queued_ahead_is_found() -> None:
    """ "3" waits on a behind "2" (not only for a's holder "1"); "2" then waits, through
    another call of its own, for c, which "3" holds: "2" waits for "3" waits for "2"."""
    table = LockTable()
    a_of_1 = take(table, [b"a"], "1")
    take(table, [b"c"], "3")
    two = Call(table, [b"a"], "2")
    waiters(table, 1)
    three = Call(table, [b"a"], "3")
    waiters(table, 2)
    with pytest.raises(DeadlockError) as raised:
        table.lock([b"c"], "2", lease_ms=60_000, wait_timeout_ms=LONG_MS)
    text = str(raised.value)
    assert "2 waits for 3 on 'c'" in text and "3 waits for 2 on 'a'" in text, text
    assert table.unlock(a_of_1)
    a_of_2 = two.result()
    assert a_of_2 is not None
    assert table.unlock(a_of_2)
    assert three.result() is not None


def test_a_cycle_closed_when_a_call_leaves_the_queue_is_found_by_a_woken_waiter() -> None:
    """No new wait closes this cycle: "x" has two calls queued on s, one ahead of "y"
    and one behind it; the later one waits only for what the first waits for (it is
    granted with it). When the first times out, the later one waits for "y", which
    (through a call of its own) waits for t, held by "x": a waiter woken by the change
    finds the cycle, and exactly one of the two calls is the victim."""
    clock = FakeClock()
    table = LockTable(clock=clock)
    take(table, [b"s"], "h")
    take(table, [b"t"], "x")
    first_of_x = Call(table, [b"s"], "x", wait_ms=1000)
    waiters(table, 1)
    y_on_s = Call(table, [b"s"], "y")
    waiters(table, 2)
    y_on_t = Call(table, [b"t"], "y")
    waiters(table, 3)
    later_of_x = Call(table, [b"s"], "x")
    waiters(table, 4)

    def wake_everyone() -> None:
        table.unlock(take(table, [b"unrelated"], "p"))

    # Every waiter wakes and checks once more, finding no cycle: from now on only a
    # change of the graph makes them look again.
    wake_everyone()
    until(
        lambda: all(
            grant.checked_at == table._graph_changes
            for grants in list(table._graph.waiting.values())
            for grant in grants
        )
    )
    clock.now += 2  # the first call of "x" is past its wait; woken, it gives up
    wake_everyone()
    assert first_of_x.result() is None
    until(lambda: later_of_x.returned.is_set() or y_on_t.returned.is_set())
    table.close()
    outcomes = []
    for call in (later_of_x, y_on_t, y_on_s):
        try:
            outcomes.append(type(call.result()))
        except (DeadlockError, LockTableClosedError) as exc:
            outcomes.append(type(exc))
    assert sorted(o.__name__ for o in outcomes[:2]) == ["DeadlockError", "LockTableClosedError"]
    assert outcomes[2] is LockTableClosedError


def test_plain_fifo_waiting_is_no_deadlock() -> None:
    table = LockTable()
    deadlocks = sample("percolake_lock_deadlocks_total")
    held = take(table, [b"x"], "0")
    calls = []
    for owner in ("1", "2", "3", "4"):
        calls.append(Call(table, [b"x"], owner))
        waiters(table, len(calls))
    assert table.unlock(held)
    for call in calls:
        token = call.result()
        assert token is not None
        assert table.unlock(token)
    assert sample("percolake_lock_deadlocks_total") == deadlocks


def test_sorted_batches_and_ordered_incremental_grants_never_deadlock() -> None:
    """Batches in any order are sorted; owners that lock one descriptor at a time in one
    global order never wait in a cycle either. No call is refused as a deadlock."""
    table = LockTable()
    deadlocks = sample("percolake_lock_deadlocks_total")
    errors: list[BaseException] = []

    def batches(owner: str, descriptors: list[bytes]) -> None:
        try:
            for i in range(30):
                token = table.lock(descriptors, f"{owner}.{i}", 60_000, LONG_MS)
                assert token is not None
                table.unlock(token)
        except BaseException as exc:
            errors.append(exc)

    def one_by_one(owner: str) -> None:
        try:
            for i in range(30):
                tokens = [table.lock([d], f"{owner}.{i}", 60_000, LONG_MS) for d in (b"1", b"2")]
                # The commit's batch locks the same cells again, with the same owner.
                tokens.append(table.lock([b"1", b"2", b"3"], f"{owner}.{i}", 60_000, LONG_MS))
                for token in tokens:
                    assert token is not None
                    table.unlock(token)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=batches, args=("a", [b"1", b"2", b"3"])),
        threading.Thread(target=batches, args=("b", [b"3", b"2", b"1"])),
        threading.Thread(target=one_by_one, args=("c",)),
        threading.Thread(target=one_by_one, args=("d",)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S * 2)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert sample("percolake_lock_deadlocks_total") == deadlocks
    assert len(table) == 0 and table.waiter_count() == 0


@pytest.mark.parametrize("prioritized", [False, True], ids=["arrival-order", "oldest-first"])
def test_owners_locking_one_by_one_in_random_orders_never_wait_out_a_deadlock(
    prioritized: bool,
) -> None:
    """Every deadlock among owners that lock cells one at a time, in orders of their own
    (as get_for_update does), is found: no call waits until its timeout, each victim
    releases its owner's locks and retries, and everyone finishes. ``prioritized``: each
    attempt's start timestamp is its priority (a retry begins later, so it gets a larger
    one), and every cycle through the priority-ordered queues is found too."""
    table = LockTable()
    timed_out: list[str] = []
    errors: list[BaseException] = []
    start_ts = itertools.count(1)
    ts_lock = threading.Lock()
    start = threading.Barrier(6)

    def owner(name: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait(JOIN_S)
            for _ in range(15):
                while True:
                    with ts_lock:
                        ts = next(start_ts)
                    priority = ts if prioritized else None
                    held: list[LockToken] = []
                    try:
                        for cell in rng.sample([b"1", b"2", b"3", b"4"], 3):
                            token = table.lock([cell], f"{name}.{ts}", 60_000, LONG_MS, priority)
                            if token is None:
                                timed_out.append(name)
                                return
                            held.append(token)
                            time.sleep(0.001)  # let the others interleave
                        break
                    except DeadlockError:
                        continue  # its transaction aborts and retries with a new start
                    finally:
                        for token in held:
                            table.unlock(token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=owner, args=(f"o{i}", i)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S * 2)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == [] and timed_out == []
    assert len(table) == 0 and table.waiter_count() == 0


# --- priorities (transactions queue by start timestamp, oldest first) ------------------


def grant_order(table: LockTable, held: LockToken, calls: dict[str, Call]) -> list[str]:
    """Release ``held``, then each grant as it comes: the owners in the order the waiting
    ``calls`` were granted. Only the head of the queue can take a free lock, so exactly
    one call returns after each release."""
    order: list[str] = []
    pending = dict(calls)
    token = held
    while pending:
        assert table.unlock(token)
        until(lambda: any(call.returned.is_set() for call in pending.values()))
        (name,) = [name for name, call in pending.items() if call.returned.is_set()]
        got = pending.pop(name).result()
        assert got is not None
        order.append(name)
        token = got
    assert table.unlock(token)
    return order


def test_an_older_waiter_that_arrives_later_is_granted_before_a_younger_one() -> None:
    table = LockTable()
    held = take(table, [b"x"], "0")
    calls: dict[str, Call] = {}
    for start_ts in (30, 20, 10):  # the youngest arrives first
        calls[str(start_ts)] = Call(table, [b"x"], str(start_ts), priority=start_ts)
        waiters(table, len(calls))
    assert grant_order(table, held, calls) == ["10", "20", "30"]
    assert table.waiter_count() == 0 and len(table) == 0


def test_equal_priorities_stay_fifo_and_no_later_call_passes_one_without_priority() -> None:
    """Equal priorities keep their arrival order; a call without a priority waits in
    arrival order and is passed by nobody, so a prioritized call that comes after it
    waits behind it (whatever its priority) and neither kind can starve."""
    table = LockTable()
    held = take(table, [b"x"], "0")
    arrivals: list[tuple[str, int | None]] = [
        ("a5", 5),
        ("b5", 5),
        ("plain", None),
        ("c9", 9),
        ("d1", 1),  # passes c9, not plain
        ("e5", 5),  # passes c9, not d1
    ]
    calls: dict[str, Call] = {}
    for name, priority in arrivals:
        calls[name] = Call(table, [b"x"], name, priority=priority)
        waiters(table, len(calls))
    assert grant_order(table, held, calls) == ["a5", "b5", "plain", "d1", "e5", "c9"]


def test_a_lock_server_client_sends_the_priority_over_grpc() -> None:
    """RemoteLockService -> LockServicer -> LockTable: an unset priority stays unset (a
    plain call is not passed), a set one orders the queue."""
    table = LockTable()
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    lock_pb2_grpc.add_LockServiceServicer_to_server(LockServicer(table), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn = Connection(f"127.0.0.1:{port}")
    try:
        remote = RemoteLockService(conn)
        held = remote.lock([b"x"], "0", 60_000)
        assert held is not None
        calls: dict[str, Call] = {}
        for name, priority in [("plain", None), ("young", 20), ("old", 10)]:
            calls[name] = Call(remote, [b"x"], name, priority=priority)
            waiters(table, len(calls))
        assert grant_order(table, held, calls) == ["plain", "old", "young"]
        with pytest.raises(ValueError, match="priority"):
            remote.lock([b"x"], "0", 60_000, priority=-1)
    finally:
        conn.close()
        server.stop(None)


def test_a_replica_set_leader_orders_its_queue_by_priority() -> None:
    """ControlPlane.lock hands the priority to the leader's table."""
    store = open_store("memory://")
    plane = ControlPlane(store, lease_ms=5000, failover_s=1.0)
    plane.lease.address = "127.0.0.1:1"
    plane.lease.step()
    assert plane.lease.valid()
    try:
        held = plane.lock([b"x"], "0", lease_ms=60_000)
        assert held is not None
        young = Call(plane, [b"x"], "20", priority=20)
        until(lambda: len(plane.lock_waits(5)) == 1)
        old = Call(plane, [b"x"], "10", priority=10)
        until(lambda: len(plane.lock_waits(5)) == 2)
        assert plane.unlock(held)
        got = old.result()
        assert got is not None
        assert not young.returned.is_set()  # still behind the older one
        assert plane.unlock(got)
        got = young.result()
        assert got is not None and plane.unlock(got)
    finally:
        plane.close()


@pytest.mark.parametrize("priority", [-1, True, 1.5, "1"])
def test_a_bad_priority_is_refused(priority: object) -> None:
    table = LockTable()
    with pytest.raises(ValueError, match="priority"):
        table.lock([b"x"], "o", 1000, priority=priority)  # type: ignore[arg-type]
    assert len(table) == 0


def test_a_cycle_closed_by_a_call_that_goes_ahead_is_found() -> None:
    """ "10" waits, through one call, for z held by "30"; "30" waits on x behind the
    holder. Another call of "10" then queues on x ahead of "30" (older): "30" now waits
    for "10" as well, a cycle whose other edge leaves "10" by its first call. The call
    that went ahead closed it, and is the victim."""
    table = LockTable()
    x_of_0 = take(table, [b"x"], "0")
    z_of_30 = take(table, [b"z"], "30")
    z_of_10 = Call(table, [b"z"], "10", priority=10)
    waiters(table, 1)
    x_of_30 = Call(table, [b"x"], "30", priority=30)
    waiters(table, 2)
    with pytest.raises(DeadlockError) as raised:
        # Bounded so that a build which misses the cycle fails instead of hanging.
        table.lock([b"x"], "10", lease_ms=60_000, wait_timeout_ms=2_000, priority=10)
    text = str(raised.value)
    assert "10 waits for 30 on 'z'" in text and "30 waits for 10 on 'x'" in text, text
    assert table.waiter_count() == 2  # the victim left; the others still wait
    assert table.unlock(x_of_0)
    got = x_of_30.result()
    assert got is not None
    assert table.unlock(got) and table.unlock(z_of_30)
    got = z_of_10.result()
    assert got is not None and table.unlock(got)
    assert len(table) == 0 and table.waiter_count() == 0


def test_an_older_call_queued_ahead_is_no_deadlock() -> None:
    """The same calls with the priorities swapped: "10" holds z and goes ahead of "30"
    on x, so "30"'s wait for z leads to "10", which waits only for x's holder. In
    arrival order ("30" first on x) this would be a cycle; in priority order it is none."""
    table = LockTable()
    deadlocks = sample("percolake_lock_deadlocks_total")
    x_of_0 = take(table, [b"x"], "0")
    z_of_10 = take(table, [b"z"], "10")
    x_of_30 = Call(table, [b"x"], "30", priority=30)
    waiters(table, 1)
    x_of_10 = Call(table, [b"x"], "10", priority=10)
    waiters(table, 2)
    z_of_30 = Call(table, [b"z"], "30", priority=30)
    waiters(table, 3)
    assert [(w.owner, w.waits_for) for w in table.waits() if w.descriptor == b"z"] == [("30", "10")]
    assert table.unlock(x_of_0)
    got = x_of_10.result()
    assert got is not None
    assert table.unlock(got) and table.unlock(z_of_10)
    for call in (x_of_30, z_of_30):
        got = call.result()
        assert got is not None and table.unlock(got)
    assert sample("percolake_lock_deadlocks_total") == deadlocks
    assert len(table) == 0 and table.waiter_count() == 0


def test_a_try_lock_never_waits_so_it_is_never_a_victim() -> None:
    table = LockTable()
    take(table, [b"a"], "1")
    take(table, [b"b"], "2")
    one = Call(table, [b"b"], "1")
    waiters(table, 1)
    assert table.lock([b"a"], "2", lease_ms=1000, wait_timeout_ms=0) is None
    table.close()
    with pytest.raises(LockTableClosedError):
        one.result()


def test_a_deadlock_message_cuts_long_descriptors_and_owners() -> None:
    table = LockTable()
    long_a, long_b = b"a" * 3000, b"\x00\xff" * 1500
    owner_1, owner_2 = "1" * 500, "2" * 500
    take(table, [long_a], owner_1)
    take(table, [long_b], owner_2)
    one = Call(table, [long_b], owner_1)
    waiters(table, 1)
    with pytest.raises(DeadlockError) as raised:
        table.lock([long_a], owner_2, lease_ms=1000, wait_timeout_ms=LONG_MS)
    assert len(str(raised.value)) < 600
    assert render_descriptor(long_b).startswith("\\x00\\xff")
    assert render_descriptor(long_b).endswith("(3000 bytes)")
    assert render_descriptor(b"t\x00\x01") == "t\\x00\\x01"
    table.close()
    with pytest.raises(LockTableClosedError):
        one.result()


# --- visible waits ----------------------------------------------------------------------


def test_waits_lists_the_longest_waits_first_with_whom_they_wait_for() -> None:
    clock = FakeClock()
    table = LockTable(clock=clock)
    assert table.waits() == []
    take(table, [b"x"], "holder")
    take(table, [b"y"], "other")
    early = Call(table, [b"x"], "early")
    waiters(table, 1)
    clock.now += 2.0
    late = Call(table, [b"x"], "late")
    waiters(table, 2)
    clock.now += 0.5
    on_y = Call(table, [b"y"], "on-y")
    waiters(table, 3)
    got = table.waits()
    assert [(w.owner, w.descriptor, w.waits_for) for w in got] == [
        ("early", b"x", "holder"),
        ("late", b"x", "holder"),
        ("on-y", b"y", "other"),
    ]
    assert [w.waited_s for w in got] == [2.5, 0.5, 0.0]
    assert [w.owner for w in table.waits(limit=1)] == ["early"]
    with pytest.raises(ValueError):
        table.waits(limit=-1)
    table.close()
    assert table.waits() == []
    for call in (early, late, on_y):
        with pytest.raises(LockTableClosedError):
            call.result()
    assert table.waiter_count() == 0


def test_the_waiters_gauge_and_the_timeout_counter() -> None:
    table = LockTable()
    gauge = sample("percolake_lock_waiters")
    timeouts = sample("percolake_lock_wait_timeouts_total")
    waits = sample("percolake_lock_waits_total")
    held = take(table, [b"x"], "1")
    waiting = Call(table, [b"x"], "2")
    waiters(table, 1)
    assert sample("percolake_lock_waiters") - gauge == 1
    assert table.unlock(held)
    assert waiting.result() is not None
    assert sample("percolake_lock_waiters") == gauge
    assert table.lock([b"x"], "3", lease_ms=1000, wait_timeout_ms=20) is None
    assert sample("percolake_lock_wait_timeouts_total") - timeouts == 1
    assert sample("percolake_lock_waits_total") - waits == 2
    assert table.waiter_count() == 0 and table.waits() == []


def test_a_replica_set_leader_reports_its_waits_and_its_deadlocks() -> None:
    """Through the control plane of a replica set (the leader's table answers): the
    status lists the wait, and a deadlock victim gets DeadlockError, not a retry."""
    store = open_store("memory://")
    plane = ControlPlane(store, lease_ms=5000, failover_s=1.0)
    plane.lease.address = "127.0.0.1:1"
    plane.lease.step()
    assert plane.lease.valid()
    status = ControlServicer(role="locks", store="memory://", address=lambda: "x", control=plane)
    try:
        assert plane.lock([b"a"], "1", lease_ms=60_000) is not None
        b_of_2 = plane.lock([b"b"], "2", lease_ms=60_000)
        assert b_of_2 is not None
        one = Call(plane, [b"b"], "1")
        until(lambda: len(plane.lock_waits(5)) == 1)
        got = status.GetStatus(pb.GetStatusRequest(), None)  # type: ignore[arg-type]
        assert [(w.owner, w.descriptor, w.waits_for) for w in got.lock_waits] == [("1", b"b", "2")]
        assert got.locks_held == 3  # batches in the table: two granted, one waiting
        with pytest.raises(DeadlockError):
            plane.lock([b"a"], "2", lease_ms=60_000, wait_timeout_ms=LONG_MS)
        assert plane.unlock(b_of_2)
        assert one.result() is not None
        assert plane.lock_waits(5) == []
    finally:
        plane.close()
