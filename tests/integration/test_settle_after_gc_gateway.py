"""Settling through ``percolake serve`` after garbage collection, and read-only commits
whose reply was lost (issue 30, items 1 and 4), with real gateway processes.

Two replicas of ``percolake serve`` on one SQLite store: the first collects garbage
(retention 0) while clients commit through it; a client of the second settles a
transaction it knows only by id, as a client whose Commit reply was lost does after
its gateway died (the second gateway never saw the transaction, so the store is its
only source of truth).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from percolake.tools.chaos.failpoints_serve import COMMIT_REPLY
from storage_adapters import Cell, open_store
from tests.property._remote_harness import control_handle, failpoint_gateway, steer
from tests.servers import ServerProcess
from txn import TransactionManager, TransactionStatus
from txn.errors import CommitUnknownError, OutcomeForgottenError, TransactionAbortedError
from txn.remote import RemoteTransactionManager
from txn.tables import GC_TABLE, STATE_KEY, TXN_TABLE, GcState, txn_key
from wire.v1 import transaction_pb2 as pb

pytestmark = pytest.mark.integration

HOT = Cell(b"hot", b"c")


def _entry_gone(url: str, start_ts: int) -> bool:
    store = open_store(url)
    try:
        return txn_key(start_ts) not in store.get_system(TXN_TABLE, [txn_key(start_ts)])
    finally:
        store.close()


def _two_gateways(
    tmp_path: Path, first_args: list[str]
) -> Iterator[tuple[ServerProcess, ServerProcess, str]]:
    url = f"sqlite:///{tmp_path}/settle.db"
    store = open_store(url)
    store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=200).encode())
    store.close()
    first = ServerProcess("all", ["--store", url, *first_args], tmp_path).start()
    other = ServerProcess("all", ["--store", url], tmp_path).start()
    yield first, other, url
    other.stop()
    first.stop()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess, str]]:
    """The first gateway collects garbage with retention 0."""
    yield from _two_gateways(tmp_path, ["--gc-interval-s", "0.3", "--gc-retention-s", "0"])


@pytest.fixture
def uncollected(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess, str]]:
    """Neither gateway collects: an entry that is missing was never written, and the
    safe point stays at 0. (With retention 0, a pass may raise the safe point past a
    transaction younger than a registration interval, by design: its settle then
    answers "no longer known" instead of the fence the test checks, as it did once on
    a loaded machine.)"""
    yield from _two_gateways(tmp_path, [])


def test_a_committed_transaction_whose_entry_was_collected_is_never_settled_aborted(
    replicas: tuple[ServerProcess, ServerProcess, str],
) -> None:
    """Failed before the fix: the settle through the other gateway found no entry,
    wrote ABORTED and answered ABORTED for a committed transaction, while readers saw
    its write through the commit stamp. The interleaving: T commits through the first
    gateway, its reply is lost, a pass stamps T's version and deletes its entry, T's
    client settles late through the second gateway."""
    collecting, other, url = replicas
    writer = TransactionManager.remote(collecting.address, timeout_s=20)
    settler = TransactionManager.remote(other.address, timeout_s=20)
    assert isinstance(settler, RemoteTransactionManager)
    try:
        tx = writer.begin()
        tx.put("t", HOT.row, HOT.column, b"committed")
        commit_ts = tx.commit()
        for i in range(3):  # later commits: the retention point passes T
            writer.run(lambda t, i=i: t.put("t", b"later", b"c", b"%d" % i))
        deadline = time.monotonic() + 30
        while not _entry_gone(url, tx.start_ts):
            assert time.monotonic() < deadline, "garbage collection never collected T"
            time.sleep(0.1)

        # By id only (another process, a retry loop): no longer known, never aborted.
        with pytest.raises(OutcomeForgottenError, match="no longer known") as caught:
            settler.outcome(tx.id, settle=True)
        assert isinstance(caught.value, CommitUnknownError)
        assert not isinstance(caught.value, TransactionAbortedError)
        assert _entry_gone(url, tx.start_ts)  # no ABORTED was written

        # T's own client names the cells it wrote (RemoteTransaction._settle does).
        got = settler._stub.Status(
            pb.StatusRequest(
                txn_id=tx.id,
                settle=True,
                written=[pb.WrittenCell(table="t", row=HOT.row, column=HOT.column)],
            ),
            timeout=20,
        )
        assert got.state == pb.TRANSACTION_STATE_COMMITTED
        assert got.commit_ts == commit_ts
        assert settler.begin().get("t", HOT.row, HOT.column) == b"committed"
    finally:
        writer.close()
        settler.close()


@pytest.fixture(scope="module")
def steered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = failpoint_gateway(tmp_path_factory.mktemp("readonly"))
    yield server
    server.stop()


def test_a_read_only_commit_whose_reply_was_lost_is_not_aborted(steered: ServerProcess) -> None:
    """Failed before the fix: the Commit of a transaction that only read never ran
    (its reply dropped), the client settled it, the gateway fenced it by aborting it
    and the client got ``TransactionAbortedError`` for valid reads. A read-only commit
    needs no entry: it settles as committed at its snapshot."""
    tm = TransactionManager.remote(steered.address, timeout_s=20)
    helper = TransactionManager.remote(steered.address, timeout_s=20)
    assert isinstance(tm, RemoteTransactionManager) and isinstance(helper, RemoteTransactionManager)
    try:
        tm.run(lambda t: t.put("ro", b"r", b"c", b"v"))
        tx = tm.begin()
        assert tx.get("ro", b"r", b"c") == b"v"
        steer(control_handle(helper, tx.id), {COMMIT_REPLY: b"drop"})
        assert tx.commit() == tx.start_ts
        assert tx.status is TransactionStatus.COMMITTED
        # Every later question gets the same answer.
        assert helper.outcome(tx.id) is TransactionStatus.COMMITTED
        assert helper.outcome(tx.id, settle=True) is TransactionStatus.COMMITTED
    finally:
        tm.close()
        helper.close()


def test_a_lost_reply_of_a_transaction_an_attached_handle_wrote_is_not_read_only(
    steered: ServerProcess,
) -> None:
    """The owner wrote nothing itself, but an executor that attached did: its dropped
    Commit must settle as not committed, never as a read-only success that would lose
    the executor's writes."""
    tm = TransactionManager.remote(steered.address, timeout_s=20)
    executor = TransactionManager.remote(steered.address, timeout_s=20)
    assert isinstance(tm, RemoteTransactionManager)
    assert isinstance(executor, RemoteTransactionManager)
    try:
        tx = tm.begin()
        handle = executor.attach(tx.id)
        handle.put("ro", b"from-executor", b"c", b"v")
        handle.flush()
        steer(control_handle(executor, tx.id), {COMMIT_REPLY: b"drop"})
        with pytest.raises(TransactionAbortedError):
            tx.commit()
        assert tm.begin().get("ro", b"from-executor", b"c") is None
    finally:
        tm.close()
        executor.close()


def test_a_read_only_settle_on_another_gateway_needs_no_entry_unless_an_executor_wrote(
    uncollected: tuple[ServerProcess, ServerProcess, str],
) -> None:
    """The owner's gateway is gone (here: never asked), so the settling gateway knows
    only the store. Failed before the fix: the read-only transaction was fenced with
    ABORTED. And the rule's limit: once an attached handle wrote, the first gateway
    recorded it in the store before buffering, so a read-only owner's settle fences
    it as usual instead of reporting a success that would drop the executor's writes."""
    first, other, url = uncollected
    owner = TransactionManager.remote(first.address, timeout_s=20)
    executor = TransactionManager.remote(first.address, timeout_s=20)
    settler = TransactionManager.remote(other.address, timeout_s=20)
    assert isinstance(executor, RemoteTransactionManager)
    assert isinstance(settler, RemoteTransactionManager)

    def settle_read_only(txn_id: str) -> pb.StatusResponse:
        request = pb.StatusRequest(txn_id=txn_id, settle=True, read_only=True)
        return settler._stub.Status(request, timeout=20)

    try:
        reader = owner.begin()
        reader.get("t", HOT.row, HOT.column)
        got = settle_read_only(reader.id)
        assert got.state == pb.TRANSACTION_STATE_COMMITTED
        assert got.commit_ts == reader.start_ts
        assert _entry_gone(url, reader.start_ts)  # no entry written

        shared = owner.begin()
        handle = executor.attach(shared.id)
        handle.put("t", b"from-executor", b"c", b"v")
        handle.flush()
        assert settle_read_only(shared.id).state == pb.TRANSACTION_STATE_ABORTED
    finally:
        owner.close()
        executor.close()
        settler.close()
