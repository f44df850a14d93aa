"""``spark.readStream.format("percolake")`` end to end: a real gateway and local Spark.

A streaming read takes committed versions in order. Each test appends through
``Lakehouse`` (the witness) or the batch data source, runs the query with
``Trigger.AvailableNow`` or ``processAllAvailable`` into a memory sink, and counts
what arrived. Every wait is bounded by ``STREAM_WAIT_S``. A query left running for
``processAllAvailable`` triggers every ``STREAM_POLL_INTERVAL`` (tests/spark_plugin.py).

Tests that read table files run on a local warehouse and on an ``s3://`` one of the
session's MinIO (``warehouse``); checkpoints and sinks stay local (Spark's own).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import Lakehouse, Retention, register
from tests.servers import ServerProcess
from tests.spark_plugin import STREAM_POLL_INTERVAL
from txn import TransactionManager
from txn.remote import RemoteTransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
STREAM_WAIT_S = 120

_names = itertools.count()


class Env:
    def __init__(self, gateway: str, workdir: Path, lh: Lakehouse) -> None:
        self.gateway = gateway
        self.workdir = workdir
        self.lh = lh

    def table(self, partition_by: tuple[str, ...] = ()) -> str:
        name = f"s{next(_names)}"
        self.lh.create_table(name, SCHEMA, partition_by)
        return name

    def checkpoint(self) -> str:
        return str(self.workdir / f"ckpt{next(_names)}")


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, RemoteTransactionManager]]:
    """One gateway for the module: its address and a manager on it."""
    workdir = tmp_path_factory.mktemp("datasource_stream")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/store.db"], workdir).start()
    tm = TransactionManager.remote(server.address)
    try:
        yield server.address, tm
    finally:
        tm.close()
        server.stop()


@pytest.fixture
def env(gateway: tuple[str, RemoteTransactionManager], warehouse: str, tmp_path: Path) -> Env:
    """The module's gateway, a fresh warehouse and a local folder for checkpoints and sinks."""
    address, tm = gateway
    return Env(address, tmp_path, Lakehouse(tm, warehouse))


#: Tests of offsets, options and retention logic: once, on a local warehouse.
local_only = pytest.mark.parametrize("warehouse", ["local"], indirect=True)


@pytest.fixture(scope="module")
def ds(spark: SparkSession) -> SparkSession:
    register(spark)
    return spark


def rows(spark: SparkSession, ids: range) -> DataFrame:
    return spark.createDataFrame([(i, f"d{i % 3}") for i in ids], SCHEMA)


def append(ds: SparkSession, env: Env, table: str, ids: range, files: int = 1) -> None:
    env.lh.append(table, rows(ds, ids).repartition(files))


def stream(ds: SparkSession, env: Env, table: str, **options: str) -> DataFrame:
    reader = ds.readStream.format("percolake").option("gateway", env.gateway)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(table)


def run_available_now(sdf: DataFrame, sink: str, checkpoint: str) -> list[int]:
    """Run the query to the end of what is available now; the rows of each micro-batch.

    ``sink`` names a memory table; a ``/`` in it makes it a Parquet folder instead (a
    memory sink cannot restart from its checkpoint).
    """
    writer = sdf.writeStream.option("checkpointLocation", checkpoint)
    writer = (
        writer.format("parquet").option("path", sink)
        if "/" in sink
        else writer.format("memory").queryName(sink)
    )
    query = writer.trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(STREAM_WAIT_S), "the query did not finish in time"
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()


def ids_in(ds: SparkSession, sink: str) -> list[int]:
    got = ds.read.parquet(sink) if "/" in sink else ds.sql(f"select id from {sink}")
    return sorted(r["id"] for r in got.select("id").collect())


def test_a_stream_starts_with_the_snapshot_then_follows_new_versions(
    ds: SparkSession, env: Env
) -> None:
    table = env.table()
    append(ds, env, table, range(0, 10))
    append(ds, env, table, range(10, 20))
    sink = f"snap_{table}"
    query = (
        stream(ds, env, table)
        .writeStream.format("memory")
        .queryName(sink)
        .option("checkpointLocation", env.checkpoint())
        .trigger(processingTime=STREAM_POLL_INTERVAL)
        .start()
    )
    try:
        query.processAllAvailable()
        assert ids_in(ds, sink) == list(range(20))  # the latest version's snapshot
        append(ds, env, table, range(20, 25))
        query.processAllAvailable()
        assert ids_in(ds, sink) == list(range(25))  # and then the new version
        assert query.exception() is None
    finally:
        query.stop()


def test_a_partitioned_table_streams_its_snapshot_and_new_versions_with_partition_values(
    ds: SparkSession, env: Env
) -> None:
    """Issue 30 item 5. Fails before the fix: every streaming read of a partitioned table
    crashed in its read tasks (``KeyError: 'Field "day" does not exist in schema'``):
    the reader learned the partition columns on the driver only, and Spark's read
    tasks run a reader of their own. Both write paths feed it, with NULL and ``''``
    partition values (one default partition, read back as NULL: item 6)."""
    table = env.table(partition_by=("day",))
    days: list[str | None] = ["d0", "", None]
    env.lh.append(table, ds.createDataFrame([(i, days[i % 3]) for i in range(6)], SCHEMA))
    sink = f"part_{table}"
    query = (
        stream(ds, env, table, maxFilesPerTrigger="2")
        .writeStream.format("memory")
        .queryName(sink)
        .option("checkpointLocation", env.checkpoint())
        .trigger(processingTime=STREAM_POLL_INTERVAL)
        .start()
    )
    try:
        query.processAllAvailable()
        later = ds.createDataFrame([(i, days[i % 3]) for i in range(6, 9)], SCHEMA)
        later.write.format("percolake").mode("append").option("gateway", env.gateway).save(table)
        query.processAllAvailable()
        assert query.exception() is None
        got = sorted((r["id"], r["day"]) for r in ds.sql(f"select id, day from {sink}").collect())
    finally:
        query.stop()
    assert got == [(i, "d0" if i % 3 == 0 else None) for i in range(9)]


@local_only
def test_starting_version_reads_changes_from_that_version(ds: SparkSession, env: Env) -> None:
    table = env.table()
    for start in (0, 10, 20):
        append(ds, env, table, range(start, start + 10))  # versions 1, 2, 3
    sink = f"from2_{table}"
    run_available_now(stream(ds, env, table, startingVersion="2"), sink, env.checkpoint())
    assert ids_in(ds, sink) == list(range(10, 30))
    latest = f"latest_{table}"
    assert (
        run_available_now(
            stream(ds, env, table, startingVersion="latest"), latest, env.checkpoint()
        )
        == []
    )


@local_only
def test_max_files_per_trigger_splits_micro_batches_and_a_restart_resumes(
    ds: SparkSession, env: Env
) -> None:
    table = env.table()
    append(ds, env, table, range(0, 40), files=4)  # one version of 4 files
    append(ds, env, table, range(40, 50), files=1)
    sink, ckpt = str(env.workdir / f"out_{table}"), env.checkpoint()
    batches = run_available_now(
        stream(ds, env, table, startingVersion="0", maxFilesPerTrigger="3"), sink, ckpt
    )
    assert len(batches) == 2, batches  # files 1-3 of version 1, then its 4th and version 2
    assert sum(batches) == 50
    assert ids_in(ds, sink) == list(range(50))
    # A restart from the checkpoint reads only what came after.
    append(ds, env, table, range(50, 55))
    again = run_available_now(
        stream(ds, env, table, startingVersion="0", maxFilesPerTrigger="3"), sink, ckpt
    )
    assert again == [5]
    assert ids_in(ds, sink) == list(range(55))


@local_only
def test_an_overwrite_stops_the_stream_unless_change_commits_are_skipped(
    ds: SparkSession, env: Env
) -> None:
    table = env.table()
    append(ds, env, table, range(0, 10))  # version 1
    env.lh.overwrite(table, rows(ds, range(100, 103)))  # version 2
    append(ds, env, table, range(10, 15))  # version 3
    with pytest.raises(Exception, match=r"version 2 of table .* is an OVERWRITE"):
        run_available_now(
            stream(ds, env, table, startingVersion="0"), f"ow_{table}", env.checkpoint()
        )
    sink = f"skip_{table}"
    run_available_now(
        stream(ds, env, table, startingVersion="0", skipChangeCommits="true"),
        sink,
        env.checkpoint(),
    )
    assert ids_in(ds, sink) == list(range(15))


def test_a_version_whose_files_vacuum_removed_fails_the_stream_naming_it(
    ds: SparkSession, env: Env
) -> None:
    table = env.table()
    append(ds, env, table, range(0, 10))  # version 1: its files go with the overwrite
    env.lh.overwrite(table, rows(ds, range(100, 103)))  # version 2
    append(ds, env, table, range(10, 15))  # version 3
    assert env.lh.vacuum(table, retain_seconds=0)
    with pytest.raises(Exception, match=r"version 1 of table .* vacuum removed its files"):
        run_available_now(
            stream(ds, env, table, startingVersion="0", skipChangeCommits="true"),
            f"vac_{table}",
            env.checkpoint(),
        )
    # The version after the overwrite reads as usual.
    sink = f"vac3_{table}"
    run_available_now(stream(ds, env, table, startingVersion="3"), sink, env.checkpoint())
    assert ids_in(ds, sink) == list(range(10, 15))


@local_only
def test_a_stream_whose_next_version_expired_fails_naming_it_and_the_retention(
    ds: SparkSession, env: Env
) -> None:
    table = f"s{next(_names)}"
    # Half a second of retention: only the sleep below has to outlast it (issue 29).
    env.lh.create_table(table, SCHEMA, retention=Retention(0.5, 0.5))
    append(ds, env, table, range(0, 10))  # version 1
    sink, ckpt = str(env.workdir / f"out_{table}"), env.checkpoint()
    assert run_available_now(stream(ds, env, table, startingVersion="1"), sink, ckpt) == [10]
    append(ds, env, table, range(10, 20))  # version 2: where the checkpoint resumes
    append(ds, env, table, range(20, 30))  # version 3
    time.sleep(0.75)
    append(ds, env, table, range(30, 40))  # version 4
    readable = env.lh.expire(table).readable_from
    assert readable >= 3  # versions up to 2 were replaced more than the 0.5 s retention ago
    with pytest.raises(
        Exception,
        match=r"version 2 of table '\w+': it expired under the table's log retention \(0\.5 s\)",
    ):
        run_available_now(stream(ds, env, table, startingVersion="1"), sink, ckpt)
    assert ids_in(ds, sink) == list(range(10))  # nothing read past the expired version
    # As the error says: a new checkpoint from the oldest readable version reads on.
    again = f"expired_{table}"
    run_available_now(
        stream(ds, env, table, startingVersion=str(readable)), again, env.checkpoint()
    )
    assert ids_in(ds, again) == list(range(10 * (readable - 1), 40))


@local_only
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"maxFilesPerTrigger": "0"}, "maxFilesPerTrigger must be at least 1"),
        ({"maxFilesPerTrigger": "many"}, "maxFilesPerTrigger must be a non-negative integer"),
        ({"startingVersion": "-1"}, "startingVersion must be a non-negative integer"),
        ({"skipChangeCommits": "yes", "startingVersion": "0"}, "skipChangeCommits must be"),
        ({"startingVersion": "0", "versionAsOf": "1"}, "versionAsOf is for batch reads"),
        ({"startingVersion": "0", "txnAppId": "a"}, r"unknown option\(s\) \['txnAppId'\]"),
    ],
)
def test_bad_stream_options_are_refused_by_name(
    ds: SparkSession, env: Env, options: dict[str, str], message: str
) -> None:
    table = env.table()
    with pytest.raises(Exception, match=message):
        stream(ds, env, table, **options)


@local_only
def test_a_starting_version_beyond_the_table_and_a_batch_read_with_stream_options(
    ds: SparkSession, env: Env
) -> None:
    table = env.table()
    with pytest.raises(Exception, match=r"startingVersion 9 .* beyond its latest version 0"):
        run_available_now(
            stream(ds, env, table, startingVersion="9"), f"far_{table}", env.checkpoint()
        )
    batch = ds.read.format("percolake").option("gateway", env.gateway)
    with pytest.raises(Exception, match="startingVersion is for streaming reads"):
        batch.option("startingVersion", "0").load(table).collect()
