"""One timestamp oracle per SQLite store (rule S7), across ``percolake serve`` processes.

Why the claim exists, and the same rule within one process, are in
``tests/unit/test_oracle_claim.py``: this file shows a second server refused while the
first serves, and a restart after a crash serving above everything served before.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ServerProcess
from txn import TransactionManager

pytestmark = pytest.mark.integration


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


def _lock_file(tmp_path: Path) -> str:
    return f"{tmp_path}/store.db.oracle.lock"


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


def test_a_second_percolake_serve_exits_while_the_first_serves_and_restarts_go_above(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """Fails before the fix: the second ``percolake serve`` started and served.

    Then the first is killed (SIGKILL, so nothing is cleaned up): the OS releases its
    lock, and the next server starts and serves above everything the first served.
    """
    store = ["--store", _url(tmp_path)]
    first = ServerProcess("all", store, tmp_path).start()
    servers.append(first)
    client = TransactionManager.remote(first.address)
    served: list[int] = []
    for i in range(5):
        with client.begin() as tx:
            served.append(tx.start_ts)
            tx.put("t", b"r", b"c", b"%d" % i)
        assert tx.commit_ts is not None
        served.append(tx.commit_ts)

    for role in ("all", "tso"):
        second = ServerProcess(role, store, tmp_path)
        servers.append(second)
        with pytest.raises(RuntimeError, match="exited"):
            second.start()
        assert second.proc is not None and second.proc.returncode == 3
        output = second.output()
        assert "another timestamp oracle" in output and _lock_file(tmp_path) in output
        assert f"pid {first.pid}" in output
        assert "Traceback" not in output  # a message, not a crash

    with client.begin() as tx:  # the first keeps serving, undisturbed
        assert tx.get("t", b"r", b"c") == b"4"
        served.append(tx.start_ts)
    client.close()

    # Gateways only open the store: several on one store are legitimate.
    gateway = ServerProcess(
        "txn", [*store, "--tso", first.address, "--locks", first.address], tmp_path
    ).start()
    servers.append(gateway)
    via_gateway = TransactionManager.remote(gateway.address)
    with via_gateway.begin() as tx:
        assert tx.get("t", b"r", b"c") == b"4"
    via_gateway.close()

    os.kill(first.pid, signal.SIGKILL)
    first.kill()  # reaps it
    restarted = ServerProcess("all", store, tmp_path).start()
    servers.append(restarted)
    client = TransactionManager.remote(restarted.address)
    with client.begin() as tx:
        assert tx.start_ts > max(served)
        assert tx.get("t", b"r", b"c") == b"4"
    client.close()
