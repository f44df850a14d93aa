"""Pessimistic reads (issue 28): ``get_for_update`` locks at read time, reads at a fresh
``for_update_ts`` and moves the commit's conflict check for that cell there.

Embedded, on memory and SQLite. What is checked: the locked read sees commits after
the snapshot; a waiter reads the holder's commit and commits after it where a plain
read would conflict; counters stay exact under threads; read-your-writes; the commit
never settles or aborts its own version; the ordering rule (a writer that began later
and committed first still wins); SERIALIZABLE still validates unlocked reads;
lock-wait timeouts and deadlocks abort with the right reason and release the locks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lockserver import LockTable
from storage_adapters import VersionWrite
from txn import Isolation, Transaction, TransactionConfig, TransactionManager, TransactionStatus
from txn.errors import DeadlockError, TransactionClosedError, TransactionConflictError
from txn.tables import TXN_TABLE, encode_outcome, txn_key
from wire import metrics

pytestmark = pytest.mark.unit

T = "t"
X, Y = (b"x", b"v"), (b"y", b"v")
JOIN_S = 30.0


def _config(lock_wait_ms: int = 5_000) -> TransactionConfig:
    return TransactionConfig(resolve_wait_ms=300, lock_wait_ms=lock_wait_ms, settle_backoff_ms=1)


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/p.db"


@pytest.fixture
def tm(url: str) -> Iterator[TransactionManager]:
    with TransactionManager.embedded(url, config=_config()) as manager:
        yield manager


def _put(tm: TransactionManager, cell: tuple[bytes, bytes], value: bytes) -> None:
    with tm.begin() as tx:
        tx.put(T, *cell, value)


def _read(tm: TransactionManager, cell: tuple[bytes, bytes]) -> bytes | None:
    with tm.begin() as tx:
        return tx.get(T, *cell)


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``fn`` in a thread; its result or exception lands in the returned list."""
    out: list[object] = []

    def body() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test, which asserts on it
            out.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def _join(thread: threading.Thread) -> None:
    thread.join(JOIN_S)
    assert not thread.is_alive(), "thread still running: a lock wait never ended"


def test_get_for_update_reads_a_commit_made_after_the_snapshot(tm: TransactionManager) -> None:
    earlier = tm.begin()
    tx = tm.begin()
    earlier.put(T, *X, b"1")
    earlier.commit()  # committed after tx's start_ts
    assert tx.get(T, *Y) is None
    assert tx.get(T, *X) is None  # the snapshot does not see it
    assert tx.get_for_update(T, *X) == b"1"  # the locked read does
    tx.put(T, *X, b"2")
    commit_ts = tx.commit()  # it began before us and we read its value: no conflict
    assert tx.status is TransactionStatus.COMMITTED
    # Our own version (at start_ts, below for_update_ts) was neither settled nor
    # aborted by our own check: the entry is our commit, and it is what reads see.
    assert tm.outcome(tx.id) is TransactionStatus.COMMITTED
    assert commit_ts > tx.start_ts
    assert _read(tm, X) == b"2"


def test_a_waiter_reads_the_holders_commit_and_commits_after_it(tm: TransactionManager) -> None:
    _put(tm, X, b"0")
    first, second = tm.begin(), tm.begin()
    assert first.get_for_update(T, *X) == b"0"

    def increment() -> bytes | None:
        value = second.get_for_update(T, *X)  # waits for first
        second.put(T, *X, str(int(value or b"0") + 1).encode())
        second.commit()
        return value

    thread, out = _in_thread(increment)
    first.put(T, *X, b"1")
    first.commit()  # its lock step reenters the lock it holds
    _join(thread)
    assert out == [b"1"]
    assert _read(tm, X) == b"2"


def test_the_same_race_with_plain_reads_conflicts(tm: TransactionManager) -> None:
    """The control: optimistic read-modify-write loses the second writer."""
    _put(tm, X, b"0")
    first, second = tm.begin(), tm.begin()
    assert first.get(T, *X) == b"0"
    assert second.get(T, *X) == b"0"
    first.put(T, *X, b"1")
    first.commit()
    second.put(T, *X, b"1")
    with pytest.raises(TransactionConflictError):
        second.commit()
    assert _read(tm, X) == b"1"


def test_threads_incrementing_one_counter_with_get_for_update_count_exactly(
    tm: TransactionManager,
) -> None:
    threads, increments = 4, 15
    conflicts = [0] * threads

    def worker(i: int) -> None:
        done = 0
        while done < increments:
            tx = tm.begin()
            try:
                value = tx.get_for_update(T, *X)
                tx.put(T, *X, str(int(value or b"0") + 1).encode())
                tx.commit()
                done += 1
            except TransactionConflictError:
                # Only the ordering rule: a writer that began after this one locked
                # first (see test_a_writer_that_began_later_and_committed_first_wins).
                conflicts[i] += 1
                if tx.status is TransactionStatus.ACTIVE:
                    tx.abort()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        _join(w)
    assert _read(tm, X) == str(threads * increments).encode()
    # Each conflict lost a start-order race; never one per commit, as optimistic would.
    assert sum(conflicts) < threads * increments


def test_the_older_of_two_waiters_is_granted_first_and_both_commit(
    tm: TransactionManager,
) -> None:
    """T2 (younger) queues on the cell before T1 (older). Granted first, T2 would commit
    a version above T1's start and T1's write could then not commit (the ordering rule):
    waiters queue by start timestamp instead, so T1 goes first and both increments
    commit with no conflict."""
    _put(tm, X, b"0")
    holder = tm.begin()
    older, younger = tm.begin(), tm.begin()
    assert older.start_ts < younger.start_ts
    table = tm.locks
    assert isinstance(table, LockTable)
    assert holder.get_for_update(T, *X) == b"0"
    granted: list[str] = []

    def increment(name: str, tx: Transaction) -> bytes | None:
        value = tx.get_for_update(T, *X)
        granted.append(name)
        tx.put(T, *X, str(int(value or b"0") + 1).encode())
        tx.commit()
        return value

    def queued(count: int) -> None:
        for _ in range(int(JOIN_S / 0.002)):
            if table.waiter_count() == count:
                return
            time.sleep(0.002)
        raise AssertionError(f"{count} waiters never queued")

    second, second_out = _in_thread(lambda: increment("younger", younger))
    queued(1)
    first, first_out = _in_thread(lambda: increment("older", older))
    queued(2)
    holder.put(T, *X, b"1")
    holder.commit()
    _join(first)
    _join(second)
    assert granted == ["older", "younger"]
    assert first_out == [b"1"] and second_out == [b"2"]  # no conflict: values, not errors
    assert older.status is younger.status is TransactionStatus.COMMITTED
    assert _read(tm, X) == b"3"


def test_run_pessimistic_increments_exactly(tm: TransactionManager) -> None:
    threads, increments = 4, 10

    def increment(tx):  # type: ignore[no-untyped-def]
        assert tx.pessimistic
        value = tx.get(T, *X)  # a locked read in a pessimistic transaction
        tx.put(T, *X, str(int(value or b"0") + 1).encode())

    def worker() -> None:
        for _ in range(increments):
            tm.run(increment, pessimistic=True, max_attempts=50)

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        _join(w)
    assert _read(tm, X) == str(threads * increments).encode()


def test_get_for_update_reads_its_own_write_and_still_locks(url: str) -> None:
    with TransactionManager.embedded(url, config=_config(lock_wait_ms=100)) as tm:
        _put(tm, X, b"0")
        tx = tm.begin()
        tx.put(T, *X, b"mine")
        assert tx.get_for_update(T, *X) == b"mine"
        other = tm.begin()
        with pytest.raises(TransactionConflictError, match="lock-wait timeout"):
            other.get_for_update(T, *X)
        tx.commit()
        assert _read(tm, X) == b"mine"


def test_a_lock_wait_timeout_aborts_and_the_holder_commits(url: str) -> None:
    with TransactionManager.embedded(url, config=_config(lock_wait_ms=100)) as tm:
        holder, waiter = tm.begin(), tm.begin()
        holder.get_for_update(T, *X)
        waiter.get_for_update(T, *Y)  # holds y; the abort must release it
        before = metrics.ABORTS_BY_REASON["lock_timeout"]._value.get()
        with pytest.raises(TransactionConflictError, match="lock-wait timeout") as caught:
            waiter.get_for_update(T, *X)
        assert caught.value.reason == "conflict"
        assert waiter.status is TransactionStatus.ABORTED
        assert metrics.ABORTS_BY_REASON["lock_timeout"]._value.get() == before + 1
        with pytest.raises(TransactionClosedError):
            waiter.put(T, *X, b"late")
        third = tm.begin()
        assert third.get_for_update(T, *Y) is None  # released at once, no wait
        third.abort()
        holder.put(T, *X, b"1")
        holder.commit()
        assert _read(tm, X) == b"1"


def test_locks_are_released_after_commit_and_abort(url: str) -> None:
    with TransactionManager.embedded(url, config=_config(lock_wait_ms=100)) as tm:
        committed = tm.begin()
        committed.get_for_update(T, *X)
        committed.put(T, *X, b"1")
        committed.commit()
        aborted = tm.begin()
        aborted.get_for_update(T, *Y)
        aborted.abort()
        read_only = tm.begin()
        assert read_only.get_for_update(T, *X) == b"1"
        read_only.commit()
        after = tm.begin()  # every lock above is free: no lock-wait timeout
        assert after.get_for_update(T, *X) == b"1"
        assert after.get_for_update(T, *Y) is None
        after.commit()


def test_a_writer_that_began_later_and_committed_first_wins(tm: TransactionManager) -> None:
    """Versions sort by their writers' start timestamps: a writer that began after us and
    committed the cell before we locked it must stay the newest, so our write of it is
    refused at once (a plain read of it, or a read-only transaction, is fine)."""
    tx = tm.begin()
    _put(tm, X, b"later")
    assert tx.get_for_update(T, *X) == b"later"
    with pytest.raises(TransactionConflictError, match="began after"):
        tx.put(T, *X, b"mine")
    assert tx.status is TransactionStatus.ABORTED
    again = tm.begin()  # the abort released the lock; a retry commits
    assert again.get_for_update(T, *X) == b"later"
    again.put(T, *X, b"mine")
    again.commit()
    assert _read(tm, X) == b"mine"
    reader = tm.begin()
    _put(tm, Y, b"later")
    assert reader.get_for_update(T, *Y) == b"later"
    assert reader.commit() == reader.start_ts  # read only: nothing to refuse


def test_the_commit_refuses_a_later_started_writer_that_committed_before_for_update_ts(
    tm: TransactionManager,
) -> None:
    """The check itself, past get_for_update's early refusal: a writer that began after
    us and committed before our for_update_ts is injected once we have read. Checking it
    from for_update_ts (it committed before: "read") would let our version, sorted below
    its own, commit after it, and every reader would keep its value: a lost update."""
    tx = tm.begin()
    burnt = [tm.begin() for _ in range(3)]  # timestamps between start_ts and F
    assert tx.get_for_update(T, *X) is None
    writer, commit_ts = burnt[0].start_ts, burnt[1].start_ts
    tm.store.put_versions(T, [VersionWrite(X[0], X[1], writer, b"theirs")])
    tm.store.put_unless_exists(TXN_TABLE, txn_key(writer), encode_outcome(commit_ts))
    tx.put(T, *X, b"mine")
    with pytest.raises(TransactionConflictError, match="started after"):
        tx.commit()
    assert _read(tm, X) == b"theirs"


def test_a_writer_committing_after_for_update_ts_still_conflicts(
    tm: TransactionManager,
) -> None:
    """Locks are liveness only: once the lock is lost (the lock server restarted), the
    commit-time check from for_update_ts refuses the lost update."""
    early = tm.begin()
    tx = tm.begin()
    assert tx.get_for_update(T, *X) is None
    tm.replace_locks(LockTable())  # a lock server restart: every lock is lost
    early.put(T, *X, b"theirs")
    early.commit()  # began before tx, committed after its for_update_ts
    tx.put(T, *X, b"mine")
    with pytest.raises(TransactionConflictError, match="read the cell at"):
        tx.commit()
    assert _read(tm, X) == b"theirs"


def test_serializable_still_validates_an_unlocked_read(tm: TransactionManager) -> None:
    _put(tm, X, b"0")
    _put(tm, Y, b"0")
    tx = tm.begin(Isolation.SERIALIZABLE)
    assert tx.get_for_update(T, *X) == b"0"
    assert tx.get(T, *Y) == b"0"
    _put(tm, Y, b"changed")
    tx.put(T, *X, b"1")
    with pytest.raises(TransactionConflictError, match="serialization failure"):
        tx.commit()
    assert _read(tm, X) == b"0"


def test_serializable_refuses_a_cell_read_with_two_values(tm: TransactionManager) -> None:
    """Read at start_ts, then locked at for_update_ts after a commit changed it: one
    value cannot be validated at commit_ts, so neither order of the reads may pass."""
    for locked_first in (False, True):
        _put(tm, X, b"0")
        earlier = tm.begin()
        tx = tm.begin(Isolation.SERIALIZABLE)
        earlier.put(T, *X, b"changed")
        earlier.commit()  # after tx's snapshot, before its locked read
        with pytest.raises(TransactionConflictError, match="serialization failure"):
            if locked_first:
                assert tx.get_for_update(T, *X) == b"changed"
                tx.get(T, *X)  # at start_ts: b"0"
            else:
                assert tx.get(T, *X) == b"0"
                tx.get_for_update(T, *X)
        assert tx.status is TransactionStatus.ABORTED
    same = tm.begin(Isolation.SERIALIZABLE)  # nothing changed in between: fine
    assert same.get(T, *X) == same.get_for_update(T, *X) == same.get(T, *X) == b"changed"
    same.put(T, *X, b"1")
    same.commit()


def test_a_deadlock_aborts_one_victim_and_the_other_commits(tm: TransactionManager) -> None:
    a, b = tm.begin(), tm.begin()
    a.get_for_update(T, *X)
    b.get_for_update(T, *Y)
    both = threading.Barrier(2)

    def lock_then_commit(tx, cell):  # type: ignore[no-untyped-def]
        both.wait(JOIN_S)
        tx.get_for_update(T, *cell)
        tx.put(T, *X, b"1")
        tx.put(T, *Y, b"1")
        return tx.commit()

    ta, out_a = _in_thread(lambda: lock_then_commit(a, Y))
    tb, out_b = _in_thread(lambda: lock_then_commit(b, X))
    _join(ta)
    _join(tb)
    outcomes = out_a + out_b
    victims = [o for o in outcomes if isinstance(o, DeadlockError)]
    winners = [o for o in outcomes if isinstance(o, int)]
    assert len(victims) == 1 and len(winners) == 1, outcomes
    assert victims[0].reason == "deadlock"
    assert isinstance(victims[0], TransactionConflictError)
    victim = a if out_a == victims else b
    assert victim.status is TransactionStatus.ABORTED
    assert _read(tm, X) == b"1" and _read(tm, Y) == b"1"


def test_each_cell_locked_is_counted_once(tm: TransactionManager) -> None:
    before = metrics.PESSIMISTIC_LOCKS._value.get()
    tx = tm.begin()
    tx.get_for_update(T, *X)
    tx.get_for_update(T, *X)  # already held: no second lock, the same for_update_ts
    tx.get_for_update(T, *Y)
    tx.commit()
    assert metrics.PESSIMISTIC_LOCKS._value.get() == before + 2


def test_get_for_update_checks_its_arguments(tm: TransactionManager) -> None:
    tx = tm.begin()
    with pytest.raises(ValueError):
        tx.get_for_update(T, b"", b"c")
    with pytest.raises((TypeError, ValueError)):
        tx.get_for_update("bad table!", b"r", b"c")
    with pytest.raises(TypeError):
        tm.begin(pessimistic="yes")  # type: ignore[arg-type]
    tx.abort()
    with pytest.raises(TransactionClosedError):
        tx.get_for_update(T, *X)
