"""Multi-table commits: ``lh.transaction()`` commits every table it wrote, or none.

Through a real ``percolake serve`` process first (the gateway's ``CommitTables``), then
on embedded managers. Files are metadata only (``append_files`` inside the
transaction) except in the Spark test at the end, where a failing write of the second
table must leave the first one untouched. The metadata-only tests run on a local
warehouse (their files are never on any store: catalog logic only); the Spark test
runs on a local folder and on ``s3://`` on the session's MinIO (``warehouse``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import ConcurrentModificationError, DataFile, Lakehouse
from spark_integration.engine.locations import join
from spark_integration.spark import filesystem
from spark_integration.spark.hook import new_job
from tests.servers import ServerProcess
from txn import TransactionConfig, TransactionManager
from txn.remote import RemoteTransactionManager

pytestmark = pytest.mark.integration

TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)
SCHEMA = StructType([StructField("id", LongType())])

#: Catalog logic only: the store of the files makes no difference.
LOCAL = pytest.mark.parametrize("warehouse", ["local"], indirect=True)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("gateway")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/gw.db"], workdir).start()
    yield server
    server.stop()


@pytest.fixture(params=["remote-sqlite", "sqlite", "memory"])
def lh(request: pytest.FixtureRequest, tmp_path: Path, warehouse: str) -> Iterator[Lakehouse]:
    tm: TransactionManager | RemoteTransactionManager
    if request.param == "remote-sqlite":
        tm = TransactionManager.remote(request.getfixturevalue("gateway").address)
    else:
        url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"
        tm = TransactionManager.embedded(url, config=TEST_CONFIG)
    house = Lakehouse(
        cast(TransactionManager, tm),
        warehouse,
        catalog=f"c{os.urandom(6).hex()}",
        commit_timeout_s=20,
    )
    for name in ("orders", "lines"):
        house.create_table(name, SCHEMA)
    yield house
    tm.close()


def files(lh: Lakehouse, name: str, count: int) -> list[DataFile]:
    """``count`` one-row files in a fresh job folder of the table (not on disk)."""
    job = new_job(join(lh.warehouse, name))
    return [DataFile(f"{job.staging}/part-{i}.parquet", 10, 1) for i in range(count)]


@LOCAL
def test_both_tables_commit_in_one_transaction(lh: Lakehouse) -> None:
    with lh.transaction() as t:
        t.append_files("orders", files(lh, "orders", 2))
        t.append_files("lines", files(lh, "lines", 3))
    assert t.versions == {"orders": 1, "lines": 1}
    assert len(lh.files("orders")) == 2 and len(lh.files("lines")) == 3
    (orders,), (lines,) = lh.history("orders")[1:], lh.history("lines")[1:]
    assert orders.commit_ts is not None and orders.commit_ts == lines.commit_ts


@LOCAL
def test_an_exception_inside_the_block_commits_nothing(lh: Lakehouse) -> None:
    with pytest.raises(RuntimeError, match="job failed"), lh.transaction() as t:
        t.append_files("orders", files(lh, "orders", 1))
        raise RuntimeError("job failed")
    assert lh.version("orders") == 0 and lh.version("lines") == 0
    assert t.versions == {}


@LOCAL
def test_a_table_whose_check_fails_fails_the_whole_transaction(lh: Lakehouse) -> None:
    """The second table's files predate a vacuum's cutoff: neither table commits."""
    stale = files(lh, "lines", 1)  # its job folder names a start time before the vacuum
    time.sleep(0.01)  # the cutoff is a later millisecond than the job's start
    lh.vacuum("lines", retain_seconds=0)
    with pytest.raises(ConcurrentModificationError, match="vacuum"), lh.transaction() as t:
        t.append_files("orders", files(lh, "orders", 1))
        t.append_files("lines", stale)
    assert lh.version("orders") == 0
    assert [c.operation for c in lh.history("orders")] == ["CREATE TABLE"]


@LOCAL
def test_a_replayed_transaction_adds_nothing(lh: Lakehouse) -> None:
    for _ in range(2):
        with lh.transaction() as t:
            t.append_files("orders", files(lh, "orders", 1), app_id="etl", batch_id=7)
            t.append_files("lines", files(lh, "lines", 1), app_id="etl", batch_id=7)
        assert t.versions == {"orders": 1, "lines": 1}
    assert len(lh.files("orders")) == 1 and len(lh.files("lines")) == 1


@LOCAL
def test_a_table_written_twice_or_after_the_end_is_refused(lh: Lakehouse) -> None:
    with lh.transaction() as t:
        t.append_files("orders", files(lh, "orders", 1))
        with pytest.raises(ValueError, match="already written"):
            t.append_files("orders", files(lh, "orders", 1))
    with pytest.raises(Exception, match="has ended"):
        t.append_files("lines", files(lh, "lines", 1))
    assert lh.version("orders") == 1 and lh.version("lines") == 0


@pytest.mark.spark
def test_a_failing_write_of_the_second_table_leaves_both_untouched(
    spark: SparkSession, warehouse: str, gateway: ServerProcess
) -> None:
    tm = TransactionManager.remote(gateway.address)
    lh = Lakehouse(cast(TransactionManager, tm), warehouse, catalog=f"c{os.urandom(6).hex()}")
    lh.create_table("orders", SCHEMA)
    lh.create_table("lines", SCHEMA)
    good = spark.createDataFrame([(i,) for i in range(10)], SCHEMA)
    bad = spark.createDataFrame([("x",)], StructType([StructField("id", StringType())]))
    with pytest.raises(ValueError), lh.transaction() as t:
        t.append("orders", good)  # written, not yet committed
        t.append("lines", bad)  # schema mismatch: the job fails
    assert lh.version("orders") == 0 and lh.version("lines") == 0
    # The first table's files were removed: nothing can ever name them.
    assert filesystem.list_files(join(warehouse, "orders")) == []
    with lh.transaction() as t:
        t.append("orders", good)
        t.append("lines", good)
    assert lh.read(spark, "orders").count() == 10 and lh.read(spark, "lines").count() == 10
    assert t.versions == {"orders": 1, "lines": 1}
    tm.close()
