"""One Spark job, one transaction: executors attach to the driver's transaction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from spark_integration import write_cells
from tests.servers import ServerProcess
from txn import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def remote_tm(tmp_path: Path) -> Iterator[TransactionManager]:
    server = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/gw.db"], tmp_path).start()
    tm = TransactionManager.remote(server.address)
    yield tm
    tm.close()
    server.stop()


def _fail_on(bad: int):  # type: ignore[no-untyped-def]
    def check(value: int) -> int:
        if value == bad:
            raise RuntimeError(f"task failed on row {value}")
        return value

    return check


def test_executors_write_one_atomic_transaction(
    remote_tm: TransactionManager, spark: SparkSession
) -> None:
    df = spark.createDataFrame(
        [(i, f"name-{i}", i * 10) for i in range(200)], "id LONG, name STRING, score LONG"
    )
    commit_ts = write_cells(df.repartition(4), remote_tm, "people", row_col="id")
    reader = remote_tm.begin()
    assert reader.start_ts > commit_ts
    cells = list(reader.scan("people"))
    assert len(cells) == 400  # two columns per row
    assert reader.get("people", b"17", b"name") == b"name-17"
    assert reader.get("people", b"17", b"score") == b"170"


def test_a_failed_task_leaves_no_partial_effect(
    remote_tm: TransactionManager, spark: SparkSession
) -> None:
    fail = F.udf(_fail_on(150), LongType(), useArrow=False)
    df = spark.createDataFrame([(i, i) for i in range(200)], "id LONG, v LONG").repartition(4)
    doomed = df.withColumn("v", fail(F.col("v")))
    with pytest.raises(Exception, match=r"task failed|Exception"):
        write_cells(doomed, remote_tm, "people", row_col="id")
    # Three of the four tasks succeeded and sent their cells; none of it is visible.
    assert list(remote_tm.begin().scan("people")) == []
