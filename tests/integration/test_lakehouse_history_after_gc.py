"""History keeps its commit timestamps after garbage collection (issue 30, item 2).

A gateway's catalog records no commit timestamp per version (one transaction less per
commit): history looks each one up by the log record's transaction. Garbage collection
deletes transactions-table entries once their versions carry commit stamps (S9); the
log record's version is one of them, so the stamp is where history finds it then.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from spark_integration import DataFile, Lakehouse
from spark_integration.spark.hook import new_job
from storage_adapters import open_store
from tests.servers import ServerProcess
from txn import TransactionManager
from txn.tables import GC_TABLE, STATE_KEY, TXN_TABLE, GcState, txn_key

pytestmark = pytest.mark.integration

SCHEMA = StructType([StructField("id", LongType())])
CATALOG = "gc_history"
WAIT_S = 60.0


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/store.db"
    # The state row before anyone leases it, with a short grace: passes wait 200 ms.
    store = open_store(url)
    store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=200).encode())
    store.close()
    return url


def _entries_left(url: str, start_tss: list[int]) -> list[int]:
    store = open_store(url)
    try:
        rows = store.get_system(TXN_TABLE, [txn_key(ts) for ts in start_tss])
    finally:
        store.close()
    return [ts for ts in start_tss if txn_key(ts) in rows]


def _history(address: str, warehouse: Path) -> list[tuple[int, int | None, int]]:
    """``(version, commit_ts, txn_start_ts)`` of table ``t``, through the gateway."""
    tm = TransactionManager.remote(address, timeout_s=20)
    try:
        lh = Lakehouse(cast(TransactionManager, tm), warehouse, catalog=CATALOG)
        return [
            (h.record.version, h.commit_ts, h.record.txn_start_ts) for h in lh._catalog.history("t")
        ]
    finally:
        tm.close()


@pytest.fixture
def collecting_gateway(store_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        "all",
        ["--store", store_url, "--gc-interval-s", "0.5", "--gc-retention-s", "0"],
        tmp_path,
    ).start()
    yield server
    server.stop()


def test_history_keeps_commit_timestamps_after_gc_and_a_gateway_restart(
    collecting_gateway: ServerProcess, store_url: str, tmp_path: Path
) -> None:
    """Fails before the fix: every collected version's ``commit_ts`` read ``None``.

    Reproduction, with real ``percolake serve`` processes: create a table and append
    three versions through a gateway that collects garbage every 0.5 s at retention
    0; history shows each version's commit timestamp (looked up in the transactions
    table). Wait until the passes deleted those entries, then stop the gateway and
    start another on the store (its cache of outcomes is gone). Its history found no
    entry and gave ``commit_ts None`` for all four; now it reads the commit stamp the
    pass wrote on each log record's version before deleting the entry.
    """
    warehouse = tmp_path / "warehouse"
    tm = TransactionManager.remote(collecting_gateway.address, timeout_s=20)
    try:
        lh = Lakehouse(cast(TransactionManager, tm), warehouse, catalog=CATALOG)
        lh.create_table("t", SCHEMA)
        for n in (1, 2, 3):
            job = new_job(os.path.join(lh.warehouse, "t"))
            lh.append_files("t", [DataFile(f"{job.staging}/part-{n}.parquet", 10, n)])
    finally:
        tm.close()
    before = _history(collecting_gateway.address, warehouse)
    assert [v for v, _, _ in before] == [0, 1, 2, 3]
    assert all(ts is not None for _, ts, _ in before), before
    start_tss = [start for _, _, start in before]
    deadline = time.monotonic() + WAIT_S
    while _entries_left(store_url, start_tss):
        assert time.monotonic() < deadline, "garbage collection never collected the entries"
        time.sleep(0.2)
    collecting_gateway.stop()
    fresh = ServerProcess("all", ["--store", store_url], tmp_path).start()
    try:
        assert _history(fresh.address, warehouse) == before
    finally:
        fresh.stop()
