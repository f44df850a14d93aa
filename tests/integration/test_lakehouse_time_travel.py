"""Time travel by timestamp: ``lh.version_at`` and ``lh.read(..., timestamp=)``.

Through a real gateway (``GetTable`` with ``as_of_ms``) and embedded. A version's time
is its committer's clock as recorded in its log record, never decreasing from one
version to the next; the version as of a time is the latest one committed at or
before it.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from spark_integration import DataFile, Lakehouse, VersionNotFoundError
from spark_integration._hook import new_job
from tests.servers import ServerProcess
from txn import TransactionConfig, TransactionManager
from txn.remote import RemoteTransactionManager

pytestmark = pytest.mark.integration

TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)
SCHEMA = StructType([StructField("id", LongType())])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("gateway")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/gw.db"], workdir).start()
    yield server
    server.stop()


@pytest.fixture(params=["remote-sqlite", "sqlite"])
def lh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lakehouse]:
    tm: TransactionManager | RemoteTransactionManager
    if request.param == "remote-sqlite":
        tm = TransactionManager.remote(request.getfixturevalue("gateway").address)
    else:
        tm = TransactionManager.embedded(f"sqlite:///{tmp_path}/store.db", config=TEST_CONFIG)
    yield Lakehouse(
        cast(TransactionManager, tm), tmp_path / "warehouse", catalog=f"c{os.urandom(6).hex()}"
    )
    tm.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def append(lh: Lakehouse, n: int) -> int:
    job = new_job(os.path.join(lh.warehouse, "t"))
    return lh.append_files("t", [DataFile(f"{job.staging}/part-{n}.parquet", 10, n)])


def tick() -> int:
    """A millisecond strictly between the commits before and after it."""
    time.sleep(0.005)
    at = now_ms()
    time.sleep(0.005)
    return at


def test_the_version_as_of_a_time_is_the_latest_committed_by_then(lh: Lakehouse) -> None:
    before_create = tick()
    lh.create_table("t", SCHEMA)
    times = [tick()]
    for n in (1, 2, 3):
        append(lh, n)
        times.append(tick())
    assert [lh.version_at("t", t) for t in times] == [0, 1, 2, 3]
    utc = datetime.datetime.fromtimestamp(times[2] / 1000, tz=datetime.UTC)
    assert lh.version_at("t", utc) == 2
    assert lh.version_at("t", utc.replace(tzinfo=None)) == 2  # naive means UTC
    assert lh.version_at("t", utc.isoformat()) == 2
    assert lh.version_at("t", utc.isoformat().replace("+00:00", "Z")) == 2
    with pytest.raises(VersionNotFoundError, match="created after"):
        lh.version_at("t", before_create)
    with pytest.raises(VersionNotFoundError, match="future"):
        lh.version_at("t", now_ms() + 60_000)


def test_bad_timestamps_are_refused_by_name(lh: Lakehouse) -> None:
    lh.create_table("t", SCHEMA)
    with pytest.raises(ValueError, match="ISO-8601"):
        lh.version_at("t", "yesterday")
    with pytest.raises(TypeError, match="timestamp"):
        lh.version_at("t", True)
    with pytest.raises(ValueError, match="negative"):
        lh.version_at("t", -1)


@pytest.mark.spark
def test_read_as_of_a_timestamp(spark: SparkSession, lh: Lakehouse) -> None:
    lh.create_table("t", SCHEMA)
    df = spark.createDataFrame([(i,) for i in range(5)], SCHEMA)
    lh.append("t", df)
    between = tick()
    lh.append("t", df)
    assert lh.read(spark, "t", timestamp=between).count() == 5
    assert lh.read(spark, "t").count() == 10
    with pytest.raises(ValueError, match="not both"):
        lh.read(spark, "t", version=1, timestamp=between)
