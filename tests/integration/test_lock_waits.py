"""Lock waits through a real ``percolake serve locks`` (issue 28): two clients that
deadlock get one ``DeadlockError`` (reason ``deadlock``) and one lock, ``percolake
status`` shows the wait while it lasts, and a client waiting in a lock server that dies
gets an error instead of hanging."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lockserver import LockToken
from lockserver.lock_service import RemoteLockService
from percolake.serve.status import run_status
from tests.servers import ServerProcess
from wire.channels import Connection
from wire.errors import DeadlockError, ServiceUnavailableError

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


def test_a_client_waiting_in_a_lock_server_that_dies_gets_an_error(
    server: ServerProcess,
) -> None:
    holder_conn, waiter_conn = Connection(server.address), Connection(server.address)
    try:
        assert RemoteLockService(holder_conn).lock([b"x"], "holder", LEASE_MS) is not None
        waiter = Waiting(
            lambda: RemoteLockService(waiter_conn).lock([b"x"], "w", LEASE_MS, WAIT_MS)
        )
        deadline = time.monotonic() + JOIN_S
        while not _waits(server.address):
            assert time.monotonic() < deadline, "the wait never showed in the status"
            time.sleep(0.02)
        server.kill()
        assert isinstance(waiter.result(), ServiceUnavailableError)
    finally:
        holder_conn.close()
        waiter_conn.close()
