"""Lock waits through a real ``percolake serve locks`` (issue 28): two clients that
deadlock get one ``DeadlockError`` (reason ``deadlock``) and one lock, ``percolake
status`` shows the wait while it lasts, a caller that went away mid-wait is not left
holding the lock it was granted, and a client waiting in a lock server that dies gets
an error instead of hanging."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lockserver import LockToken
from lockserver.lock_service import RemoteLockService
from percolake.serve.status import run_status
from tests.servers import ServerProcess
from wire.channels import Connection
from wire.errors import DeadlockError, ServiceUnavailableError
from wire.v1 import lock_pb2, lock_pb2_grpc

pytestmark = pytest.mark.integration

LEASE_MS = 60_000
WAIT_MS = 20_000
JOIN_S = 15.0


class Waiting:
    """A ``lock`` call in a thread: its token, or what it raised."""

    def __init__(self, call: Callable[[], LockToken | None]) -> None:
        self.outcome: list[LockToken | BaseException | None] = []

        def run() -> None:
            try:
                self.outcome.append(call())
            except BaseException as exc:  # reported to the test, which asserts on it
                self.outcome.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> LockToken | BaseException | None:
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "the lock call hung"
        return self.outcome[0]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess("locks", [], tmp_path).start()
    yield process
    process.stop()


def _status(address: str, *, as_json: bool) -> str:
    out = io.StringIO()
    run_status(address, token=None, tls=None, as_json=as_json, out=out)
    return out.getvalue()


def _waits(address: str) -> list[dict[str, Any]]:
    waits: list[dict[str, Any]] = json.loads(_status(address, as_json=True))[0]["lock_waits"]
    return waits


def test_two_clients_deadlock_one_is_the_victim_and_status_shows_the_wait(
    server: ServerProcess,
) -> None:
    conns = [Connection(server.address) for _ in range(2)]
    first, second = (RemoteLockService(conn) for conn in conns)
    try:
        assert first.lock([b"cell-a"], "1", LEASE_MS) is not None
        b_of_2 = second.lock([b"cell-b"], "2", LEASE_MS)
        assert b_of_2 is not None
        one = Waiting(lambda: first.lock([b"cell-b"], "1", LEASE_MS, WAIT_MS))

        deadline = time.monotonic() + JOIN_S
        while not (waits := _waits(server.address)):
            assert time.monotonic() < deadline, "the wait never showed in the status"
            time.sleep(0.02)
        assert [(w["owner"], w["descriptor"], w["waits_for"]) for w in waits] == [
            ("1", "cell-b", "2")
        ]
        assert "1 waits for 2 on 'cell-b'" in _status(server.address, as_json=False)

        with pytest.raises(DeadlockError) as raised:
            second.lock([b"cell-a"], "2", LEASE_MS, WAIT_MS)
        assert raised.value.reason == "deadlock"
        assert "1 waits for 2 on 'cell-b'" in str(raised.value), raised.value
        assert one.thread.is_alive()  # "2" still holds cell-b: "1" waits on

        assert second.unlock(b_of_2)  # the victim's transaction aborts
        assert isinstance(one.result(), LockToken)
        assert _waits(server.address) == []
    finally:
        for conn in conns:
            conn.close()


def _locks_held(address: str) -> int:
    held: int = json.loads(_status(address, as_json=True))[0]["locks_held"]
    return held


def test_a_caller_gone_mid_wait_holds_nothing_and_a_waiter_whose_server_dies_gets_an_error(
    server: ServerProcess,
) -> None:
    holder_conn, waiter_conn = Connection(server.address), Connection(server.address)
    try:
        holder = RemoteLockService(holder_conn)
        token = holder.lock([b"x"], "holder", LEASE_MS)
        assert token is not None
        # A caller whose own deadline ends its call long before its wait does: the grant
        # it gets once x is free is released at once, not held for its 60 s lease.
        stub = lock_pb2_grpc.LockServiceStub(waiter_conn.channel)
        request = lock_pb2.LockRequest(
            descriptors=[b"x"], owner="gone", lease_ms=LEASE_MS, wait_timeout_ms=WAIT_MS
        )
        with pytest.raises(grpc.RpcError) as cut:
            stub.Lock(request, timeout=0.3)
        assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert holder.unlock(token)
        deadline = time.monotonic() + JOIN_S
        while _locks_held(server.address) != 0:
            assert time.monotonic() < deadline, "the gone caller's grant is still held"
            time.sleep(0.02)

        assert holder.lock([b"x"], "holder", LEASE_MS) is not None
        waiter = RemoteLockService(waiter_conn)
        waiting = Waiting(lambda: waiter.lock([b"x"], "w", LEASE_MS, WAIT_MS))
        deadline = time.monotonic() + JOIN_S
        while not _waits(server.address):
            assert time.monotonic() < deadline, "the wait never showed in the status"
            time.sleep(0.02)
        server.kill()
        assert isinstance(waiting.result(), ServiceUnavailableError)
    finally:
        holder_conn.close()
        waiter_conn.close()
