"""``format("percolake")`` and ``Lakehouse.read`` from a Spark Connect session.

The session is a gRPC client of a local Spark Connect server (``spark_connect`` in
``tests/spark_plugin.py``); a real ``percolake serve`` gateway (SQLite store) holds the
tables. Everything the client asks for runs in the server: the data source is looked
up there (the installed ``pyspark_percolake`` module, no registration), its planning
and commits run in the server's Python workers. ``Lakehouse`` on a remote manager is
the independent witness of what each write committed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
from pyspark.sql.connect.session import SparkSession as ConnectSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import Lakehouse, register
from tests.servers import ServerProcess
from txn import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])

_names = itertools.count()


class Env:
    def __init__(self, gateway: str, warehouse: Path, lh: Lakehouse) -> None:
        self.gateway = gateway
        self.warehouse = warehouse
        self.lh = lh

    def table(self) -> str:
        name = f"c{next(_names)}"
        self.lh.create_table(name, SCHEMA)
        return name


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("datasource-connect")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/store.db"], workdir).start()
    tm = TransactionManager.remote(server.address)
    try:
        yield Env(server.address, workdir / "warehouse", Lakehouse(tm, workdir / "warehouse"))
    finally:
        tm.close()
        server.stop()


def rows(cs: ConnectSession, ids: range | list[int]) -> DataFrame:
    return cs.createDataFrame([(i, f"d{i % 3}") for i in ids], SCHEMA)


def ids_of(df: DataFrame) -> list[int]:
    return sorted(r["id"] for r in df.select("id").collect())


def test_the_session_is_a_connect_client_not_the_classic_driver(
    spark_connect: ConnectSession, spark: SparkSession
) -> None:
    assert isinstance(spark_connect, ConnectSession)
    assert not isinstance(spark_connect, SparkSession)
    assert spark_connect.client.host == "127.0.0.1"
    # A client has no SparkContext of its own; what it sees is the server's.
    with pytest.raises(Exception, match="sparkContext"):
        _ = spark_connect.sparkContext
    assert spark_connect.conf.get("spark.app.id") == spark.sparkContext.applicationId


def test_connect_writes_and_reads_back_by_version_and_timestamp(
    spark_connect: ConnectSession, env: Env
) -> None:
    table = f"created{next(_names)}"
    (
        rows(spark_connect, range(10))
        .write.format("percolake")
        .mode("append")
        .option("gateway", env.gateway)
        .option("createIfMissing", "true")
        .option("warehouse", str(env.warehouse))
        .option("partitionColumns", "day")
        .save(table)
    )
    assert env.lh.version(table) == 1
    assert {f.partition["day"] for f in env.lh.files(table)} == {"d0", "d1", "d2"}
    rows(spark_connect, range(10, 15)).write.format("percolake").mode("append").option(
        "gateway", env.gateway
    ).save(table)
    assert env.lh.version(table) == 2
    assert [c.operation for c in env.lh.history(table)] == ["CREATE TABLE", "WRITE", "WRITE"]

    def read() -> object:
        return spark_connect.read.format("percolake").option("gateway", env.gateway)

    first = read().option("versionAsOf", 1).load(table)  # type: ignore[attr-defined]
    assert isinstance(first, ConnectDataFrame)
    assert first.schema == SCHEMA
    assert ids_of(first) == list(range(10))
    assert ids_of(read().load(table)) == list(range(15))  # type: ignore[attr-defined]
    at = datetime.fromtimestamp(env.lh.history(table)[1].timestamp_ms / 1000, UTC)
    by_time = read().option("timestampAsOf", at.isoformat()).load(table)  # type: ignore[attr-defined]
    assert ids_of(by_time) == list(range(10))
    assert ids_of(read().option("versionAsOf", 0).load(table)) == []  # type: ignore[attr-defined]


def test_lakehouse_read_takes_a_connect_session(spark_connect: ConnectSession, env: Env) -> None:
    table = env.table()
    empty = env.lh.read(spark_connect, table)
    assert isinstance(empty, ConnectDataFrame)
    assert empty.count() == 0
    assert empty.schema.fieldNames() == ["id", "day"]
    rows(spark_connect, range(4)).write.format("percolake").mode("append").option(
        "gateway", env.gateway
    ).save(table)
    rows(spark_connect, [7, 8]).write.format("percolake").mode("overwrite").option(
        "gateway", env.gateway
    ).save(table)
    latest = env.lh.read(spark_connect, table)
    assert isinstance(latest, ConnectDataFrame)
    assert ids_of(latest) == [7, 8]
    assert ids_of(env.lh.read(spark_connect, table, version=1)) == [0, 1, 2, 3]
    at = env.lh.history(table)[1].timestamp_ms
    assert ids_of(env.lh.read(spark_connect, table, timestamp=at)) == [0, 1, 2, 3]
    assert sorted((r["id"], r["day"]) for r in latest.collect()) == [(7, "d1"), (8, "d2")]


def test_connect_replays_register_and_refusals(spark_connect: ConnectSession, env: Env) -> None:
    table = env.table()
    # Explicit registration through the Connect client works too (the server already
    # found the installed source; registering again replaces it with the same class).
    register(spark_connect)

    def write(ids: range, batch: int, mode: str = "append") -> None:
        (
            rows(spark_connect, ids)
            .write.format("percolake")
            .mode(mode)
            .option("gateway", env.gateway)
            .option("txnAppId", "connect-job")
            .option("txnVersion", str(batch))
            .save(table)
        )

    write(range(3), 0)
    write(range(100, 103), 0)  # a replay of batch 0: adds nothing
    write(range(3, 5), 1)
    assert env.lh.version(table) == 2
    assert [(c.app_id, c.batch_id) for c in env.lh.history(table)[1:]] == [
        ("connect-job", 0),
        ("connect-job", 1),
    ]
    # The source's own errors reach the Connect client with their message.
    wrong = rows(spark_connect, range(2)).withColumnRenamed("day", "when")
    with pytest.raises(Exception, match="does not match table"):
        wrong.write.format("percolake").mode("append").option("gateway", env.gateway).save(table)
    with pytest.raises(Exception, match="has no version 9"):
        spark_connect.read.format("percolake").option("gateway", env.gateway).option(
            "versionAsOf", 9
        ).load(table).collect()
    # Spark refuses the save modes it cannot pass to a Python source, as in classic mode.
    with pytest.raises(Exception, match=r'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"ErrorIfExists"'):
        write(range(9, 10), 2, "error")
    assert env.lh.version(table) == 2
    got = spark_connect.read.format("percolake").option("gateway", env.gateway).load(table)
    assert ids_of(got) == list(range(5))
