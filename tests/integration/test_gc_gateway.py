"""Garbage collection in the deployed topology (issue 17): ``percolake serve
--gc-interval-s`` sweeps in the background while remote clients commit; a remote
transaction left below the safe point gets ``SnapshotTooOldError`` over the wire
(reason ``snapshot-too-old``); ``percolake gc`` from another process collects the same
store while the gateway serves, its retention point from the gateway's registration."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_adapters import Cell, open_store
from tests.servers import ServerProcess
from txn import TransactionManager
from txn.errors import SnapshotTooOldError, TransactionAbortedError
from txn.remote import RemoteTransactionManager
from txn.tables import GC_TABLE, STATE_KEY, GcState, read_state

pytestmark = pytest.mark.integration

HOT = Cell(b"hot", b"c")


def _store_with_short_grace(url: str) -> None:
    """The state row before anyone leases it, with a short grace: passes wait 200 ms."""
    store = open_store(url)
    store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=200).encode())
    store.close()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    url = f"sqlite:///{tmp_path}/gc.db"
    _store_with_short_grace(url)
    server = ServerProcess(
        "all", ["--store", url, "--gc-interval-s", "0.5", "--gc-retention-s", "0"], tmp_path
    ).start()
    yield server, url
    server.stop()


def _wait_for(predicate: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting for garbage collection")


def _versions(url: str) -> int:
    store = open_store(url)
    try:
        return len(store.get_versions("t", [HOT]).get(HOT, []))
    finally:
        store.close()


def _collected_below(url: str) -> int:
    store = open_store(url)
    try:
        return read_state(store)[0].collected_below
    finally:
        store.close()


def test_the_gateway_sweeps_while_clients_commit_and_old_snapshots_are_refused(
    gateway: tuple[ServerProcess, str],
) -> None:
    server, url = gateway
    tm = TransactionManager.remote(server.address, timeout_s=20)
    assert isinstance(tm, RemoteTransactionManager)
    try:
        old = tm.begin()
        for i in range(40):
            tm.run(lambda tx, i=i: tx.put("t", HOT.row, HOT.column, b"%d" % i))
        mark = max(tm.begin().start_ts, 1)
        _wait_for(lambda: _collected_below(url) > mark)
        assert _versions(url) <= 2  # the newest kept, maybe one newer than the safe point
        assert tm.begin().get("t", HOT.row, HOT.column) == b"39"
        with pytest.raises(SnapshotTooOldError, match="safe point"):
            old.get("t", HOT.row, HOT.column)
        assert issubclass(SnapshotTooOldError, TransactionAbortedError)
    finally:
        tm.close()


def test_percolake_gc_runs_beside_a_serving_gateway(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/side.db"
    _store_with_short_grace(url)
    server = ServerProcess("all", ["--store", url], tmp_path).start()
    try:
        tm = TransactionManager.remote(server.address, timeout_s=20)
        for i in range(20):
            tm.run(lambda tx, i=i: tx.put("t", HOT.row, HOT.column, b"%d" % i))
        tm.close()
        # No oracle of its own: the retention point comes from the gateway's
        # registration, published when its manager began transactions.
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "percolake",
                "gc",
                "--store",
                url,
                "--retention-s",
                "0",
                "--grace-ms",
                "200",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        report = json.loads(run.stdout)
        assert report["safe_point"] > 0, report
        tm = TransactionManager.remote(server.address, timeout_s=20)
        assert tm.begin().get("t", HOT.row, HOT.column) == b"19"
        tm.close()
    finally:
        server.stop()
