"""Safety holes of the multi-process topology, through a real ``percolake serve``.

Issue 12 found these with clients in separate processes talking to a gateway; the
suite had only driven an embedded manager. Each test failed before its fix (the
docstring gives the interleaving) and drives a real gateway process.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from storage_adapters import MAX_CELL_KEY_BYTES
from tests.servers import ServerProcess
from txn import Isolation, TransactionManager, TransactionStatus
from txn.errors import (
    NotTransactionOwnerError,
    TransactionAbortedError,
    TransactionConflictError,
    TransactionError,
)
from txn.remote import RemoteTransactionManager
from wire.v1 import transaction_pb2 as pb
from wire.v1 import transaction_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

T = "t"
C = b"c"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("gateway")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/gw.db"], workdir).start()
    yield server
    server.stop()


@pytest.fixture
def tm(gateway: ServerProcess) -> Iterator[RemoteTransactionManager]:
    manager = TransactionManager.remote(gateway.address, timeout_s=20)
    assert isinstance(manager, RemoteTransactionManager)
    yield manager
    manager.close()


_tables = iter(range(1_000_000))


@pytest.fixture
def table() -> str:
    """A fresh table per test: the module shares one gateway and store."""
    return f"t{next(_tables)}"


def test_serializable_scan_that_consumed_one_row_validates_that_row_g2(
    tm: RemoteTransactionManager, table: str
) -> None:
    """Hole 2 (G2). The client reported a scan row as consumed only when it asked
    for the next one, so a client that took exactly one row sent no bound and the
    gateway validated nothing. T1 reads the first row a1 of a scan and writes b;
    T2 reads b and overwrites a1; T2 commits, then T1 committed too (write skew
    under SERIALIZABLE). Now T1 aborts, as on the embedded manager."""
    with tm.begin() as setup:
        setup.put(table, b"a1", C, b"0")
        setup.put(table, b"a2", C, b"0")
        setup.put(table, b"b", C, b"0")
    t1 = tm.begin(Isolation.SERIALIZABLE)
    t2 = tm.begin(Isolation.SERIALIZABLE)
    first = next(iter(t1.scan(table, b"a", b"b")))
    assert first[0] == b"a1"
    t1.put(table, b"b", b"d", b"1")
    assert t2.get(table, b"b", C) == b"0"
    t2.put(table, b"a1", C, b"2")
    t2.commit()
    with pytest.raises(TransactionConflictError, match="serialization failure"):
        t1.commit()


def test_serializable_scan_stopped_mid_batch_validates_up_to_the_last_row_taken(
    tm: RemoteTransactionManager, table: str
) -> None:
    """Hole 2, the general case: the bound is the last row handed over, not the one
    before it; a row past the bound changing does not abort."""
    with tm.begin() as setup:
        for i in range(10):
            setup.put(table, f"a{i}".encode(), C, b"0")
    t1 = tm.begin(Isolation.SERIALIZABLE)
    rows = iter(t1.scan(table))
    taken = [next(rows)[0] for _ in range(3)]
    assert taken == [b"a0", b"a1", b"a2"]
    with tm.begin() as other:
        other.put(table, b"a5", C, b"changed")  # past what t1 read: no conflict
    t1.put(table, b"x", C, b"1")
    t1.commit()
    t3 = tm.begin(Isolation.SERIALIZABLE)
    rows = iter(t3.scan(table))
    assert [next(rows)[0] for _ in range(3)] == [b"a0", b"a1", b"a2"]
    with tm.begin() as other:
        other.put(table, b"a2", C, b"changed")  # the last row t3 took
    t3.put(table, b"y", C, b"1")
    with pytest.raises(TransactionConflictError):
        t3.commit()


def test_settling_an_open_transaction_fences_a_commit_still_on_its_way(
    tm: RemoteTransactionManager, gateway: ServerProcess, table: str
) -> None:
    """Hole 4 (S6). The client's Commit is still queued at the gateway (behind a
    large Write, or waiting for a worker) when someone settles the transaction.
    ``Status(settle=True)`` answered ACTIVE without fencing it; a reader took that
    as "not committed" and retried, and then the queued Commit landed too. Now the
    settle aborts the open transaction and the late Commit cannot land."""
    tx = tm.begin()
    tx.put(table, b"k", C, b"late")
    tx.flush()
    with TransactionManager.remote(gateway.address) as other:
        assert other.outcome(tx.id, settle=True) is TransactionStatus.ABORTED
        assert other.outcome(tx.id) is TransactionStatus.ABORTED
    with pytest.raises(TransactionAbortedError, match="aborted before its commit ran"):
        tx.commit()  # one of a commit's three outcomes: definitely not committed
    assert tx.status is TransactionStatus.ABORTED
    assert tm.begin().get(table, b"k", C) is None


def test_settling_a_committed_transaction_reports_its_commit(
    tm: RemoteTransactionManager, table: str
) -> None:
    tx = tm.begin()
    tx.put(table, b"k", C, b"v")
    tx.commit()
    assert tm.outcome(tx.id, settle=True) is TransactionStatus.COMMITTED


def _rows(n: int, prefix: str = "r") -> list[bytes]:
    return [f"{prefix}{i:05d}".encode() for i in range(n)]


def test_attached_writer_between_scan_batches_neither_skips_nor_repeats_rows(
    tm: RemoteTransactionManager, gateway: ServerProcess, table: str
) -> None:
    """Hole 5 through the gateway. The owner buffered writes in the table and started
    a scan, which the gateway streams in batches and keeps open between them; an
    attached executor wrote rows into the same table between two batches. The
    gateway's open iterator over the changed write buffer then returned rows twice
    and skipped others. Large values keep gRPC flow control from letting the
    gateway read the whole scan ahead before the executor writes."""
    big = b"x" * 32_768
    stored = _rows(400)
    with tm.begin() as setup:
        for row in stored:
            setup.put(table, row, C, big)
    owner = tm.begin()
    own = [row + b"y" for row in stored[1::2]]
    for row in own:
        owner.put(table, row, C, b"own")
    owner.flush()
    channel = grpc.insecure_channel(
        gateway.address, options=[("grpc.max_receive_message_length", 64 << 20)]
    )
    try:
        stub = pb_grpc.TransactionServiceStub(channel)
        batches = stub.Scan(pb.ScanRequest(txn_id=owner.id, table=table, batch_size=20))
        seen = [cell.row for _ in range(3) for cell in next(batches).cells]
        with (
            TransactionManager.remote(gateway.address) as executors,
            executors.attach(owner.id) as executor,
        ):
            for row in stored[100:]:
                executor.put(table, row + b"z", C, b"executor")
        seen += [cell.row for batch in batches for cell in batch.cells]
    finally:
        channel.close()
    assert len(seen) == len(set(seen)), "a row came twice"
    assert seen == sorted(seen)
    assert set(stored) | set(own) <= set(seen), "a row was skipped"
    owner.abort()


def test_an_attached_executor_cannot_abort_the_drivers_transaction(
    tm: RemoteTransactionManager, gateway: ServerProcess, table: str
) -> None:
    """Abort did not check the commit secret: any client that knew the id (every
    attached executor does) could abort the driver's transaction."""
    owner = tm.begin()
    owner.put(table, b"k", C, b"v")
    with TransactionManager.remote(gateway.address) as executors:
        executor = executors.attach(owner.id)
        with pytest.raises(NotTransactionOwnerError):
            executor.abort()
        channel = grpc.insecure_channel(gateway.address)
        try:
            stub = pb_grpc.TransactionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as raw:
                stub.Abort(pb.AbortRequest(txn_id=owner.id, commit_secret="guess"))
            assert raw.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        finally:
            channel.close()
        executor.detach()
    owner.commit()
    assert tm.begin().get(table, b"k", C) == b"v"


def test_closing_a_manager_with_unsent_attached_writes_is_an_error(
    tm: RemoteTransactionManager, gateway: ServerProcess, table: str
) -> None:
    """The executor's buffered writes were dropped silently when its manager closed
    without the handle's clean exit: the driver then committed without them."""
    owner = tm.begin()
    executors = TransactionManager.remote(gateway.address)
    executor = executors.attach(owner.id)
    executor.put(table, b"from-executor", C, b"v")
    with pytest.raises(TransactionError, match="unsent writes"):
        executors.close()
    owner.commit()


def test_a_failed_task_drops_its_writes_without_hiding_its_error(
    tm: RemoteTransactionManager, gateway: ServerProcess, table: str
) -> None:
    owner = tm.begin()
    with (
        pytest.raises(RuntimeError, match="task failed"),
        TransactionManager.remote(gateway.address) as executors,
    ):
        executor = executors.attach(owner.id)
        executor.put(table, b"from-executor", C, b"v")
        raise RuntimeError("task failed")
    owner.commit()
    assert tm.begin().get(table, b"from-executor", C) is None


def test_a_write_batch_with_one_cell_over_the_store_limit_buffers_nothing(
    tm: RemoteTransactionManager, gateway: ServerProcess, table: str
) -> None:
    """The gateway's all-or-nothing check of a Write looked at row and column one by one,
    not at the store's limit on the cell: a batch whose last cell no store can hold
    buffered the cells before it, then failed. Now it is refused whole."""
    tx = tm.begin()
    channel = grpc.insecure_channel(gateway.address)
    try:
        stub = pb_grpc.TransactionServiceStub(channel)
        good = pb.Mutation(table=table, row=b"good", column=C, put=b"v")
        too_long = pb.Mutation(table=table, row=b"r" * MAX_CELL_KEY_BYTES, column=C, put=b"v")
        with pytest.raises(grpc.RpcError) as refused:
            stub.Write(pb.WriteRequest(txn_id=tx.id, mutations=[good, too_long]))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "row and column" in (refused.value.details() or "")
    finally:
        channel.close()
    assert tx.get(table, b"good", C) is None  # nothing of the batch was buffered
    tx.abort()
