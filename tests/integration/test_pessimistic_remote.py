"""Pessimistic reads through a real ``percolake serve`` (issue 28): ``get_for_update``
over gRPC (``GetRequest.for_update``), ``run(fn, pessimistic=True)`` on the remote
manager, and the errors that cross: a deadlock victim's ``DeadlockError`` (reason
``deadlock``), a lock-wait timeout, a refused write to a locked cell.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from tests.servers import ServerProcess
from txn import TransactionManager, TransactionStatus
from txn.errors import DeadlockError, TransactionConflictError
from txn.remote import RemoteTransaction, RemoteTransactionManager

pytestmark = pytest.mark.integration

T = "t"
JOIN_S = 60.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("pessimistic")
    server = ServerProcess(
        "all", ["--store", f"sqlite:///{workdir}/gw.db", "--lock-wait-ms", "1000"], workdir
    ).start()
    yield server
    server.stop()


@pytest.fixture
def tm(gateway: ServerProcess) -> Iterator[RemoteTransactionManager]:
    manager = TransactionManager.remote(gateway.address)
    yield manager
    manager.close()


def _read(tm: RemoteTransactionManager, row: bytes) -> bytes | None:
    with tm.begin() as tx:
        return tx.get(T, row, b"v")


def _threads(count: int, target: Callable[[int], None]) -> None:
    workers = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(JOIN_S)
        assert not w.is_alive(), "a client thread never finished: a lock wait hung"


def test_get_for_update_increments_from_several_clients_count_exactly(
    gateway: ServerProcess,
) -> None:
    row, clients, increments = b"gfu-counter", 4, 8
    errors: list[BaseException] = []

    def client(_: int) -> None:
        manager = TransactionManager.remote(gateway.address)
        try:
            done = 0
            while done < increments:
                tx = manager.begin()
                try:
                    value = tx.get_for_update(T, row, b"v")
                    tx.put(T, row, b"v", str(int(value or b"0") + 1).encode())
                    tx.commit()
                    done += 1
                except TransactionConflictError:
                    # A writer that began later locked first: retried, as run() does.
                    assert tx.status is TransactionStatus.ABORTED
        except BaseException as exc:
            errors.append(exc)
        finally:
            manager.close()

    _threads(clients, client)
    assert errors == []
    with TransactionManager.remote(gateway.address) as tm:
        assert _read(tm, row) == str(clients * increments).encode()


def test_run_pessimistic_through_the_gateway_counts_exactly(
    tm: RemoteTransactionManager,
) -> None:
    row, threads, increments = b"run-counter", 4, 8

    def increment(tx: RemoteTransaction) -> None:
        assert tx.pessimistic
        value = tx.get(T, row, b"v")  # a locked read
        tx.put(T, row, b"v", str(int(value or b"0") + 1).encode())

    def worker(_: int) -> None:
        for _ in range(increments):
            tm.run(increment, pessimistic=True, max_attempts=50)

    _threads(threads, worker)
    assert _read(tm, row) == str(threads * increments).encode()


def test_a_deadlock_through_the_gateway_aborts_one_and_commits_the_other(
    tm: RemoteTransactionManager,
) -> None:
    x, y = b"dl-x", b"dl-y"
    a, b = tm.begin(), tm.begin()
    a.get_for_update(T, x, b"v")
    b.get_for_update(T, y, b"v")
    outcomes: dict[str, object] = {}
    both = threading.Barrier(2)

    def cross(name: str, tx: RemoteTransaction, row: bytes) -> None:
        try:
            both.wait(JOIN_S)
            tx.get_for_update(T, row, b"v")
            tx.put(T, x, b"v", name.encode())
            tx.put(T, y, b"v", name.encode())
            outcomes[name] = tx.commit()
        except BaseException as exc:
            outcomes[name] = exc

    _threads(2, lambda i: cross("a", a, y) if i == 0 else cross("b", b, x))
    victims = {n: o for n, o in outcomes.items() if isinstance(o, DeadlockError)}
    winners = {n: o for n, o in outcomes.items() if isinstance(o, int)}
    assert len(victims) == 1 and len(winners) == 1, outcomes
    (victim_name, victim_error), (winner_name, _) = *victims.items(), *winners.items()
    assert victim_error.reason == "deadlock"
    assert (a if victim_name == "a" else b).status is TransactionStatus.ABORTED
    assert _read(tm, x) == _read(tm, y) == winner_name.encode()


def test_a_lock_wait_timeout_crosses_as_a_conflict_and_releases(
    tm: RemoteTransactionManager,
) -> None:
    row = b"timeout"
    holder, waiter = tm.begin(), tm.begin()
    holder.get_for_update(T, row, b"v")
    with pytest.raises(TransactionConflictError, match="lock-wait timeout"):
        waiter.get_for_update(T, row, b"v")  # the gateway waits --lock-wait-ms
    assert waiter.status is TransactionStatus.ABORTED
    holder.put(T, row, b"v", b"held")
    holder.commit()
    assert _read(tm, row) == b"held"


def test_get_for_update_reads_a_later_commit_and_refuses_what_cannot_commit(
    tm: RemoteTransactionManager,
) -> None:
    row = b"later"
    tx = tm.begin()
    with tm.begin() as later:  # began after tx, commits first
        later.put(T, row, b"v", b"theirs")
    assert tx.get(T, row, b"v") is None
    assert tx.get_for_update(T, row, b"v") == b"theirs"
    tx.put(T, row, b"v", b"mine")  # buffered in the client until the commit flushes it
    with pytest.raises(TransactionConflictError, match="began after"):
        tx.commit()
    assert tx.status is TransactionStatus.ABORTED
    assert _read(tm, row) == b"theirs"
    own = tm.begin()
    own.put(T, row, b"v", b"own")
    assert own.get_for_update(T, row, b"v") == b"own"  # read-your-writes, locked
    own.commit()
    assert _read(tm, row) == b"own"


def test_an_attached_handle_locks_for_the_transaction_it_joined(
    tm: RemoteTransactionManager, gateway: ServerProcess
) -> None:
    row = b"attached"
    with tm.begin() as setup:
        setup.put(T, row, b"v", b"0")
    owner = tm.begin()
    with TransactionManager.remote(gateway.address) as executor_side:
        executor = executor_side.attach(owner.id)
        assert executor.get_for_update(T, row, b"v") == b"0"  # the owner's lock now
        executor.put(T, row, b"v", b"1")
        executor.detach()
    assert owner.get_for_update(T, row, b"v") == b"1"  # reentrant: same owner, own write
    other = tm.begin()
    with pytest.raises(TransactionConflictError, match="lock-wait timeout"):
        other.get_for_update(T, row, b"v")  # held by the owner's transaction
    owner.commit()
    after = tm.begin()
    assert after.get_for_update(T, row, b"v") == b"1"  # released by the commit
    after.commit()
