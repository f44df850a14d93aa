"""``format("percolake")`` end to end: a real ``percolake serve`` gateway and local Spark.

One gateway process (SQLite store) serves every test of the module; each test has
tables of its own. Spark runs the data source's planning, commit and abort in
Python workers and its writes and reads in tasks, all talking to that gateway, as
in the deployed topology. ``Lakehouse`` on a remote manager is the independent
witness of what each write committed.

Tests that touch table files run twice (``warehouse``, tests/conftest.py): on a local
folder and on ``s3://<fresh bucket>/warehouse`` of the session's MinIO, which the
tasks reach with the AWS variables they inherit. Tests of options and catalog logic
run once, locally.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from percolake.tools.s3 import S3Server
from spark_integration import Lakehouse, register
from spark_integration.engine.errors import TableNotFoundError
from spark_integration.engine.locations import (
    is_object_store,
    join,
    normalize_location,
    relative_to,
)
from spark_integration.engine.model import APPEND, FileEntry
from spark_integration.spark import filesystem
from spark_integration.spark.datasource.batch_write import (
    COMMITTING_MARKER,
    PercolakeBatchWriter,
    WritePlan,
)
from spark_integration.spark.datasource.files import write_batches
from spark_integration.spark.datasource.source import PercolakeDataSource
from spark_integration.spark.datasource.write_plan import FilesWritten, WriteTarget
from spark_integration.spark.filesystem import StorageError, spark_path
from spark_integration.spark.hook import new_job
from tests.servers import ServerProcess
from txn import TransactionManager
from txn.remote import RemoteTransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
STREAM_WAIT_S = 120.0

_names = itertools.count()


#: What a read of a file that is not there says, on a local folder and on S3.
MISSING_FILE = r"No such file|FileNotFound|Path does not exist|NoSuchKey"


class Env:
    """The gateway, a warehouse (local folder or s3://), and a Lakehouse that checks
    what was committed."""

    def __init__(
        self, gateway: str, warehouse: str, tm: RemoteTransactionManager, lh: Lakehouse
    ) -> None:
        self.gateway = gateway
        self.warehouse = warehouse
        self.tm = tm
        self.lh = lh

    def location(self, table: str) -> str:
        return join(self.warehouse, table)

    def job_folder_of(self, table: str, path: str) -> str:
        """The first folder of a file path below the table's location."""
        inside = relative_to(self.location(table), path)
        assert inside is not None, (path, table)
        return inside.split("/", 1)[0]

    def table(self, partition_by: tuple[str, ...] = ()) -> str:
        name = f"t{next(_names)}"
        self.lh.create_table(name, SCHEMA, partition_by)
        return name

    def writer(self, df: DataFrame, mode: str = "append") -> object:
        return df.write.format("percolake").mode(mode).option("gateway", self.gateway)

    def reader(self, spark: SparkSession) -> object:
        return spark.read.format("percolake").option("gateway", self.gateway)


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, RemoteTransactionManager]]:
    """One gateway for the module: its address and a manager on it."""
    workdir = tmp_path_factory.mktemp("datasource")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/store.db"], workdir).start()
    tm = TransactionManager.remote(server.address)
    try:
        yield server.address, tm
    finally:
        tm.close()
        server.stop()


@pytest.fixture
def env(gateway: tuple[str, RemoteTransactionManager], warehouse: str) -> Env:
    """Tests that touch table files: once per kind of warehouse."""
    address, tm = gateway
    return Env(address, warehouse, tm, Lakehouse(tm, warehouse))


#: Tests of options and catalog logic touch no more files on S3 than locally: once, locally.
local_only = pytest.mark.parametrize("warehouse", ["local"], indirect=True)


@pytest.fixture(scope="module")
def ds(spark: SparkSession) -> SparkSession:
    """The shared session with the source registered explicitly."""
    register(spark)
    return spark


def rows(spark: SparkSession, ids: range | list[int], days: int = 3) -> DataFrame:
    return spark.createDataFrame([(i, f"d{i % days}") for i in ids], SCHEMA)


def ids_of(df: DataFrame) -> list[int]:
    return sorted(r["id"] for r in df.select("id").collect())


def job_folders(env: Env, table: str) -> list[str]:
    names = (posixpath.basename(p) for p in filesystem.list_dirs(env.location(table)))
    return sorted(n for n in names if n.startswith("_lh_job="))


# --- registration ---------------------------------------------------------------------


@local_only
def test_spark_finds_the_source_by_name_without_registration(spark: SparkSession, env: Env) -> None:
    # A new session has none of the parent's registrations: only the installed
    # pyspark_percolake module (Spark's lookup of pyspark_* modules) can supply it.
    # Made in the JVM: register() (another module's fixture may have run it) makes
    # Python's newSession register the source when that lookup did not find it.
    fresh = SparkSession(spark.sparkContext, spark._jsparkSession.newSession())
    table = env.table()
    got = fresh.read.format("percolake").option("gateway", env.gateway).load(table)
    assert got.schema == SCHEMA
    assert got.count() == 0


# --- batch writes and reads -----------------------------------------------------------


def test_appends_commit_one_version_each_and_read_back(ds: SparkSession, env: Env) -> None:
    table = env.table()
    env.writer(rows(ds, range(10)).repartition(2)).save(table)  # type: ignore[attr-defined]
    env.writer(rows(ds, range(10, 15))).save(table)  # type: ignore[attr-defined]
    assert env.lh.version(table) == 2
    history = env.lh.history(table)
    assert [c.operation for c in history] == ["CREATE TABLE", "WRITE", "WRITE"]
    assert len(history[1].added_files) >= 2  # one file per task at least
    got = env.reader(ds).load(table)  # type: ignore[attr-defined]
    assert got.schema.fieldNames() == ["id", "day"]
    assert ids_of(got) == list(range(15))
    # The native reader reads the very files the data source wrote.
    assert ids_of(env.lh.read(ds, table)) == list(range(15))
    # Every file is in a job folder named as new_job names them (vacuum reads the time).
    for commit in history[1:]:
        for path in commit.added_files:
            folder = env.job_folder_of(table, path)
            assert folder.startswith("_lh_job=") and folder.endswith(tuple("0123456789abcdef"))


@local_only
def test_an_empty_table_reads_as_empty(ds: SparkSession, env: Env) -> None:
    table = env.table()
    got = env.reader(ds).load(table)  # type: ignore[attr-defined]
    assert got.count() == 0
    assert got.schema.fieldNames() == ["id", "day"]


def test_overwrite_replaces_every_row(ds: SparkSession, env: Env) -> None:
    table = env.table()
    env.writer(rows(ds, range(5))).save(table)  # type: ignore[attr-defined]
    env.writer(rows(ds, [100, 101]), "overwrite").save(table)  # type: ignore[attr-defined]
    assert ids_of(env.reader(ds).load(table)) == [100, 101]  # type: ignore[attr-defined]
    assert [c.operation for c in env.lh.history(table)][-1] == "OVERWRITE"


@local_only
def test_time_travel_by_version_and_by_timestamp(ds: SparkSession, env: Env) -> None:
    table = env.table()
    env.writer(rows(ds, range(3))).save(table)  # type: ignore[attr-defined]
    env.writer(rows(ds, range(3, 6))).save(table)  # type: ignore[attr-defined]
    env.writer(rows(ds, [9]), "overwrite").save(table)  # type: ignore[attr-defined]
    expected = {0: [], 1: [0, 1, 2], 2: list(range(6)), 3: [9]}
    for version, ids in expected.items():
        got = env.reader(ds).option("versionAsOf", version).load(table)  # type: ignore[attr-defined]
        assert ids_of(got) == ids, version
    history = env.lh.history(table)
    for commit in history:
        at = datetime.fromtimestamp(commit.timestamp_ms / 1000, UTC)
        for text in (at.isoformat(timespec="milliseconds"), at.strftime("%Y-%m-%d %H:%M:%S.%f")):
            got = env.reader(ds).option("timestampAsOf", text).load(table)  # type: ignore[attr-defined]
            assert ids_of(got) == expected[commit.version], (commit.version, text)
    before = datetime.fromtimestamp(history[0].timestamp_ms / 1000 - 60, UTC).isoformat()
    with pytest.raises(Exception, match="was created after"):
        env.reader(ds).option("timestampAsOf", before).load(table)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="in the future"):
        env.reader(ds).option("timestampAsOf", "2999-01-01").load(table)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="has no version 7"):
        env.reader(ds).option("versionAsOf", 7).load(table)  # type: ignore[attr-defined]


@local_only
def test_a_read_is_pinned_when_the_dataframe_is_defined(ds: SparkSession, env: Env) -> None:
    table = env.table()
    env.writer(rows(ds, range(3))).save(table)  # type: ignore[attr-defined]
    pinned = env.reader(ds).load(table)  # type: ignore[attr-defined]
    env.writer(rows(ds, range(3, 6))).save(table)  # type: ignore[attr-defined]
    assert ids_of(pinned) == [0, 1, 2]
    assert ids_of(env.reader(ds).load(table)) == list(range(6))  # type: ignore[attr-defined]


def test_create_if_missing_with_partition_columns(ds: SparkSession, env: Env) -> None:
    table = f"created{next(_names)}"
    df = ds.createDataFrame([(i, None if i == 4 else f"d{i % 2}") for i in range(6)], SCHEMA)
    (
        env.writer(df)  # type: ignore[attr-defined]
        .option("createIfMissing", "true")
        .option("warehouse", str(env.warehouse))
        .option("partitionColumns", "day")
        .save(table)
    )
    assert env.lh.version(table) == 1
    files = env.lh.files(table)
    assert {f.partition["day"] for f in files} == {"d0", "d1", None}
    for f in files:
        folder = posixpath.basename(posixpath.dirname(f.path))
        value = f.partition["day"]
        assert folder == f"day={'__HIVE_DEFAULT_PARTITION__' if value is None else value}"
    assert sum(f.record_count for f in files) == 6
    expected = sorted((i, None if i == 4 else f"d{i % 2}") for i in range(6))
    for got in (env.reader(ds).load(table), env.lh.read(ds, table)):  # type: ignore[attr-defined]
        assert sorted((r["id"], r["day"]) for r in got.collect()) == expected
    # The second write finds the table; a different partitioning is refused.
    with pytest.raises(Exception, match="does not match table"):
        (
            env.writer(df)  # type: ignore[attr-defined]
            .option("createIfMissing", "true")
            .option("warehouse", str(env.warehouse))
            .option("partitionColumns", "id")
            .save(table)
        )
    assert env.lh.version(table) == 1


def _exploding(spark: SparkSession, ids: range, bad_id: int) -> DataFrame:
    def check(i: int) -> str:
        if i == bad_id:
            raise RuntimeError(f"task failure on row {i}")
        return f"d{i % 3}"

    # Not Arrow-optimized: a plain row-at-a-time Python UDF fails its task on one row.
    explode = F.udf(check, StringType(), useArrow=False)
    return rows(spark, ids).repartition(2).select("id", explode("id").alias("day"))


# On S3 the next test covers it, with a staged file certain to exist.
@local_only
def test_a_task_failing_mid_job_leaves_the_table_untouched(ds: SparkSession, env: Env) -> None:
    table = env.table()
    env.writer(rows(ds, range(4))).save(table)  # type: ignore[attr-defined]
    before = env.lh.files(table)
    with pytest.raises(Exception, match="task failure on row 37"):
        env.writer(_exploding(ds, range(100), 37)).save(table)  # type: ignore[attr-defined]
    assert env.lh.version(table) == 1
    assert env.lh.files(table) == before
    assert ids_of(env.reader(ds).load(table)) == [0, 1, 2, 3]  # type: ignore[attr-defined]
    # abort removed the failed job's folder (no commit was ever sent for it).
    committed = {env.job_folder_of(table, f.path) for f in before}
    assert set(job_folders(env, table)) == committed


def _failing_once_staged(
    spark: SparkSession, ids: range, bad_id: int, location: str, committed_jobs: set[str]
) -> DataFrame:
    """Rows whose task holding ``bad_id`` raises only once another task of the same job
    has stored a file in the job's folder (the message names it), so the failed job
    certainly staged objects."""

    def check(i: int) -> str:
        if i != bad_id:
            return f"d{i % 3}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for stored in filesystem.list_files(location):
                job = stored.path[len(location) + 1 :].split("/", 1)[0]
                if job not in committed_jobs and stored.path.endswith(".parquet"):
                    raise RuntimeError(f"task failure on row {i} after <{stored.path}> was staged")
            time.sleep(0.2)
        raise RuntimeError(f"task failure on row {i}; no other task staged a file")

    explode = F.udf(check, StringType(), useArrow=False)
    return rows(spark, ids).repartition(2).select("id", explode("id").alias("day"))


def test_a_task_failing_mid_job_leaves_only_staged_files_that_vacuum_removes(
    ds: SparkSession, env: Env
) -> None:
    """Issue 25: a job whose task raises once another task's file is stored commits
    nothing; whatever it left below the table (abort removes its job folder, a
    straggling task may still write there) lies in a job folder no version names, and
    vacuum removes all of it."""
    table = env.table(partition_by=("day",))
    env.writer(rows(ds, range(6))).save(table)  # type: ignore[attr-defined]
    committed = {f.path for f in env.lh.files(table)}
    committed_jobs = {env.job_folder_of(table, p) for p in committed}
    failing = _failing_once_staged(ds, range(120), 77, env.location(table), committed_jobs)
    with pytest.raises(Exception, match="task failure on row 77 after <") as failed:
        env.writer(failing).save(table)  # type: ignore[attr-defined]
    staged = re.search(r"after <((?:/|s3://)[^>]+)> was staged", str(failed.value))
    assert staged is not None
    staged_job = env.job_folder_of(table, staged.group(1))
    assert staged_job.startswith("_lh_job=") and staged_job not in committed_jobs
    assert env.lh.version(table) == 1
    assert {f.path for f in env.lh.files(table)} == committed
    for stored in filesystem.list_files(env.location(table)):
        if stored.path not in committed:
            assert env.job_folder_of(table, stored.path).startswith("_lh_job="), stored.path
    removed = env.lh.vacuum(table, retain_seconds=0)
    assert not committed & set(removed)
    left = {f.path for f in filesystem.list_files(env.location(table))}
    assert {p for p in left if env.job_folder_of(table, p) not in committed_jobs} == set()
    assert not filesystem.exists(staged.group(1))
    assert committed <= left
    assert ids_of(env.reader(ds).load(table)) == list(range(6))  # type: ignore[attr-defined]


def _staged_write(env: Env, table: str) -> tuple[PercolakeBatchWriter, list[FileEntry]]:
    """A batch write planned as ``writer()`` plans it, its task's files already staged."""
    location = env.location(table)
    job = new_job(location)
    target = WriteTarget(table, env.gateway, location, ("id", "day"), ())
    plan = WritePlan(
        target, APPEND, job.job_id, job.started_ms, job.staging, None, None, None, None
    )
    batch = pa.RecordBatch.from_pydict(
        {"id": [1, 2, 3], "day": ["d1", "d2", "d0"]},
        schema=pa.schema([("id", pa.int64()), ("day", pa.string())]),
    )
    files = write_batches(
        iter([batch]),
        location=location,
        staging=job.staging,
        columns=("id", "day"),
        partition_by=(),
        tag="t",
    )
    assert files and all(filesystem.exists(join(location, f.path)) for f in files)
    return PercolakeBatchWriter(plan), files


def test_the_committing_marker_keeps_the_files_of_a_commit_that_was_sent(env: Env) -> None:
    """The ``_committing`` protocol on each store: ``abort`` removes a job's files only
    when no commit was ever sent for it. Once the marker is written (one PUT on S3, read
    back strongly), a commit that failed in a way that may have landed leaves the
    files to vacuum, which removes them once it knows no version names them."""
    table = env.table()
    location = env.location(table)
    # Aborted before commit: no marker, the job folder goes.
    writer, files = _staged_write(env, table)
    writer.abort([FilesWritten(tuple(files))])
    assert filesystem.list_files(location) == []
    # The commit is sent and fails (the gateway refuses a file path outside the table).
    writer, files = _staged_write(env, table)
    marker = join(writer.plan.staging, COMMITTING_MARKER)
    bad = FileEntry("../elsewhere.parquet", 1, 1, {})
    with pytest.raises(Exception, match="elsewhere"):
        writer.commit([FilesWritten((*files, bad))])
    assert filesystem.read_bytes(marker) == writer.plan.job_id.encode()
    writer.abort([FilesWritten(tuple(files))])
    staged = {join(location, f.path) for f in files}
    assert staged | {marker} == {f.path for f in filesystem.list_files(location)}
    assert env.lh.version(table) == 0
    # Nothing names them: vacuum removes them (the job started before its cutoff).
    assert staged <= set(env.lh.vacuum(table, retain_seconds=0))
    assert not any(filesystem.exists(p) for p in staged)
    # A commit that lands: the marker stays with the files, which the version names.
    writer, files = _staged_write(env, table)
    writer.commit([FilesWritten(tuple(files))])
    assert env.lh.version(table) == 1
    assert {f.path for f in env.lh.files(table)} == {join(location, f.path) for f in files}


def test_python_workers_inherit_the_aws_settings(ds: SparkSession, s3_server: S3Server) -> None:
    """The tasks' S3 clients read the standard AWS variables from the environment the
    executors' Python workers inherit (here the driver's, exported by the fixture before
    Spark started); a cluster sets them with spark.executorEnv.* or instance roles."""
    names = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

    def seen(_: int) -> str:
        return "|".join(os.environ.get(n, "<unset>") for n in names)

    got = ds.range(4).repartition(2).select(F.udf(seen, StringType(), useArrow=False)("id"))
    expected = "|".join(s3_server.env()[n] for n in names)
    assert {r[0] for r in got.collect()} == {expected}


@local_only
def test_an_s3_warehouse_whose_bucket_is_missing_is_refused_before_any_task_runs(
    ds: SparkSession, env: Env, s3_server: S3Server, tmp_path: Path
) -> None:
    """Issue 25: a missing bucket fails the write at planning, naming the bucket;
    nothing is created, written or committed."""
    table = f"nobucket{next(_names)}"
    writer = env.writer(_touching(ds, tmp_path / "ran"))
    writer = writer.option("createIfMissing", "true")  # type: ignore[attr-defined]
    writer = writer.option("warehouse", "s3a://pl-no-such-bucket/warehouse")
    with pytest.raises(Exception, match="bucket 'pl-no-such-bucket' does not exist"):
        writer.save(table)
    assert not (tmp_path / "ran").exists()
    with pytest.raises(TableNotFoundError):
        env.lh.version(table)


@local_only
def test_wrong_s3_credentials_are_refused_at_planning_naming_the_problem(
    env: Env, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: with credentials the store refuses, a write fails while it is planned
    (on the driver, before any task runs), saying what to fix; nothing is created or
    committed. Planned here in this process, whose AWS variables the test can change
    (a session's workers keep the ones they started with)."""
    bucket = s3_server.create_bucket(f"pl-creds-{next(_names)}")
    lh = Lakehouse(env.tm, f"s3://{bucket}/warehouse")
    existing = f"creds{next(_names)}"
    lh.create_table(existing, SCHEMA)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    new = f"creds{next(_names)}"
    cases = {
        existing: {},
        new: {"createIfMissing": "true", "warehouse": f"s3a://{bucket}/warehouse"},
    }
    for table, extra in cases.items():
        source = PercolakeDataSource({"path": table, "gateway": env.gateway, **extra})
        with pytest.raises(StorageError, match=f"refused to look up bucket '{bucket}'.*AWS_"):
            source.writer(SCHEMA, overwrite=False)
    monkeypatch.undo()
    assert lh.version(existing) == 0
    with pytest.raises(TableNotFoundError):
        lh.version(new)


def test_a_replayed_txn_version_adds_nothing(ds: SparkSession, env: Env) -> None:
    table = env.table()

    def write(ids: range, version: int) -> None:
        (
            env.writer(rows(ds, ids))  # type: ignore[attr-defined]
            .option("txnAppId", "nightly")
            .option("txnVersion", str(version))
            .save(table)
        )

    write(range(3), 0)
    write(range(3), 0)  # the same batch again: a retried job
    write(range(100, 103), 0)  # different rows, same batch: still nothing
    assert env.lh.version(table) == 1
    write(range(3, 5), 1)
    assert env.lh.version(table) == 2
    assert ids_of(env.reader(ds).load(table)) == list(range(5))  # type: ignore[attr-defined]
    marks = [(c.app_id, c.batch_id) for c in env.lh.history(table)[1:]]
    assert marks == [("nightly", 0), ("nightly", 1)]
    # The replays wrote no files at all.
    assert len(job_folders(env, table)) == 2


# --- filter pushdown ------------------------------------------------------------------

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


@contextmanager
def filter_pushdown(spark: SparkSession, enabled: bool) -> Iterator[None]:
    """The shared session with Python filter pushdown switched on or off, then restored."""
    before = str(spark.conf.get(PUSHDOWN_CONF, "false"))
    spark.conf.set(PUSHDOWN_CONF, str(enabled).lower())
    try:
        yield
    finally:
        spark.conf.set(PUSHDOWN_CONF, before)


def spark_filters(df: DataFrame) -> str:
    """The conditions of the Filter nodes Spark runs above the scan."""
    plan = str(df._jdf.queryExecution().executedPlan().toString())
    return "\n".join(line for line in plan.splitlines() if "Filter " in line)


def test_partition_filters_prune_files_when_pushdown_is_enabled(ds: SparkSession, env: Env) -> None:
    table = env.table(partition_by=("day",))
    env.writer(rows(ds, range(30))).save(table)  # type: ignore[attr-defined]
    env.writer(rows(ds, range(30, 45))).save(table)  # type: ignore[attr-defined]
    files = env.lh.files(table)
    assert {f.partition["day"] for f in files} == {"d0", "d1", "d2"}
    # Only day=d1's files stay on disk: a read that opens any other file fails.
    for f in files:
        if f.partition["day"] != "d1":
            filesystem.delete_file(f.path)
    d1 = [i for i in range(45) if i % 3 == 1]
    queries = {
        "day = 'd1'": d1,
        "day IN ('d1', 'd7')": d1,
        "day > 'd0' AND day < 'd2'": d1,
        "NOT (day <> 'd1')": d1,
        "day LIKE 'd1%' AND id >= 20": [i for i in d1 if i >= 20],
        "day = 'd1' AND id % 2 = 0": [i for i in d1 if i % 2 == 0],
    }
    with filter_pushdown(ds, True):
        for where, expected in queries.items():
            got = env.reader(ds).load(table).where(where)  # type: ignore[attr-defined]
            assert ids_of(got) == expected, where
            # Partition filters are decided per file: Spark does not filter on day again.
            assert "day#" not in spark_filters(got), where
    # The same reads without pushdown open every file (and so fail here); with it off,
    # the source still reads (Spark refuses a reader with pushFilters then).
    with filter_pushdown(ds, False), pytest.raises(Exception, match=MISSING_FILE):
        ids_of(env.reader(ds).load(table).where("day = 'd1'"))  # type: ignore[attr-defined]


def test_statistics_skip_files_and_spark_still_filters_their_rows(
    ds: SparkSession, env: Env
) -> None:
    table = env.table()
    env.writer(rows(ds, range(10)).coalesce(1)).save(table)  # type: ignore[attr-defined]
    env.writer(rows(ds, range(100, 110)).coalesce(1)).save(table)  # type: ignore[attr-defined]
    low, high = env.lh.files(table)
    # The writer recorded each file's column statistics in the log.
    assert low.stats is not None and high.stats is not None
    assert (low.stats["id"].min_value, low.stats["id"].max_value) == (0, 9)
    assert (high.stats["id"].min_value, high.stats["id"].max_value) == (100, 109)
    assert low.stats["id"].null_count == 0
    assert (low.stats["day"].min_value, low.stats["day"].max_value) == ("d0", "d2")
    filesystem.delete_file(low.path)
    with filter_pushdown(ds, True):
        reader = env.reader(ds)
        assert ids_of(reader.load(table).where("id >= 100")) == list(range(100, 110))  # type: ignore[attr-defined]
        # A filter on a data column goes back to Spark, which filters the kept file.
        assert ids_of(reader.load(table).where("id > 104")) == list(range(105, 110))  # type: ignore[attr-defined]
        assert ids_of(reader.load(table).where("id IN (50, 105)")) == [105]  # type: ignore[attr-defined]
        assert "id#" in spark_filters(reader.load(table).where("id > 104"))  # type: ignore[attr-defined]
    with filter_pushdown(ds, True), pytest.raises(Exception, match=MISSING_FILE):
        ids_of(env.reader(ds).load(table).where("id < 100"))  # type: ignore[attr-defined]


# --- partition values and partition overwrite modes (issue 30) -----------------------


def _day_rows(spark: SparkSession, days: dict[int, str | None]) -> DataFrame:
    return spark.createDataFrame(sorted(days.items()), SCHEMA)


def test_empty_and_null_partition_values_are_the_default_partition_on_both_write_paths(
    ds: SparkSession, env: Env
) -> None:
    """Issue 30 item 6. Fails before the fix: ``format("percolake")`` wrote ``''`` into a
    ``day=`` folder and recorded it apart from NULL, and ``lh.read`` of the table then
    failed with ``EMPTY_PARTITION_COLUMN_VALUE``. Both write paths (the data source's
    pyarrow writer and ``lh.append``'s Spark writer) now store ``''`` and NULL as Spark
    and Delta do: one default partition, read back as NULL."""
    table = env.table(partition_by=("day",))
    env.writer(_day_rows(ds, {0: "", 1: None, 2: "d2"})).save(table)  # type: ignore[attr-defined]
    env.lh.append(table, _day_rows(ds, {3: "", 4: None, 5: "d2"}))
    files = env.lh.files(table)
    assert {f.partition["day"] for f in files} == {None, "d2"}
    for f in files:
        value = f.partition["day"]
        folder = posixpath.basename(posixpath.dirname(f.path))
        assert folder == f"day={'__HIVE_DEFAULT_PARTITION__' if value is None else value}"
    expected = [(0, None), (1, None), (2, "d2"), (3, None), (4, None), (5, "d2")]
    for got in (env.reader(ds).load(table), env.lh.read(ds, table)):  # type: ignore[attr-defined]
        assert sorted((r["id"], r["day"]) for r in got.collect()) == expected
    with filter_pushdown(ds, True):
        nulls = env.reader(ds).load(table).where("day IS NULL")  # type: ignore[attr-defined]
        assert ids_of(nulls) == [0, 1, 3, 4]


OVERWRITE_MODE_CONF = "spark.sql.sources.partitionOverwriteMode"


@contextmanager
def session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.unset(key)


@local_only
def test_dynamic_partition_overwrite_and_replace_where_replace_only_their_partitions(
    ds: SparkSession, env: Env
) -> None:
    """Issue 30 item 7, then issue 26. Fails on both earlier behaviours: with the
    session's ``spark.sql.sources.partitionOverwriteMode=dynamic`` an overwrite of the
    rows of ``day=d1`` silently replaced the whole table (``d0`` and ``d2`` were gone),
    and later it was refused. Now the session setting and the write option replace only
    the partitions written, option ``replaceWhere`` only the partitions it names (a row
    outside it fails the job, committing nothing), and an explicit
    ``partitionOverwriteMode=static`` still replaces the table."""
    table = env.table(partition_by=("day",))
    env.writer(rows(ds, range(6))).save(table)  # type: ignore[attr-defined]
    only_d1 = rows(ds, [100, 101]).where("day = 'd1'")  # 100
    with session_conf(ds, OVERWRITE_MODE_CONF, "DYNAMIC"):
        env.writer(only_d1, "overwrite").save(table)  # type: ignore[attr-defined]
        # Appends are not overwrites: the setting does not concern them.
        env.writer(rows(ds, [6])).save(table)  # type: ignore[attr-defined]
    assert ids_of(env.reader(ds).load(table)) == [0, 2, 3, 5, 6, 100]  # type: ignore[attr-defined]
    only_d2 = rows(ds, [200]).where("day = 'd2'")
    dynamic = env.writer(only_d2, "overwrite").option("partitionOverwriteMode", "dynamic")
    dynamic.save(table)  # type: ignore[attr-defined]
    assert ids_of(env.reader(ds).load(table)) == [0, 3, 6, 100, 200]  # type: ignore[attr-defined]
    d0 = rows(ds, [300]).where("day = 'd0'")
    env.writer(d0, "overwrite").option("replaceWhere", "day = 'd0'").save(table)  # type: ignore[attr-defined]
    assert ids_of(env.reader(ds).load(table)) == [100, 200, 300]  # type: ignore[attr-defined]
    assert [h.operation for h in env.lh.history(table)][-4:] == [
        "REPLACE WHERE",
        "WRITE",
        "REPLACE WHERE",
        "REPLACE WHERE",
    ]
    folders = job_folders(env, table)
    # One task: with two, the task holding only the row inside (d1) may still be writing
    # when the job fails on the other and abort removes the folder, and recreate it
    # (ci21, three workers). Such a straggler's files are garbage for vacuum, never part
    # of a version; this checks what abort itself removes.
    outside = rows(ds, [400, 401]).coalesce(1)
    with pytest.raises(Exception, match="holds rows outside it"):
        env.writer(outside, "overwrite").option("replaceWhere", "day = 'd1'").save(table)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="must be simple conditions on the partition columns"):
        env.writer(d0, "overwrite").option("replaceWhere", "id > 3").save(table)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="partitionOverwriteMode must be static or dynamic"):
        env.writer(only_d1, "overwrite").option("partitionOverwriteMode", "some").save(table)  # type: ignore[attr-defined]
    assert env.lh.version(table) == 5
    # Every refused job's folder is gone: abort ran before any commit was sent.
    assert job_folders(env, table) == folders
    # The write option wins over the session's setting, as in Spark.
    with session_conf(ds, OVERWRITE_MODE_CONF, "dynamic"):
        static = env.writer(rows(ds, [100]), "overwrite")
        static.option("partitionOverwriteMode", "static").save(table)  # type: ignore[attr-defined]
    assert ids_of(env.reader(ds).load(table)) == [100]  # type: ignore[attr-defined]


# --- what is refused before any task runs ---------------------------------------------


def _touching(spark: SparkSession, marker: Path) -> DataFrame:
    """Rows whose computation leaves a file behind: proof that a task ran."""

    def touch(i: int) -> str:
        marker.mkdir(parents=True, exist_ok=True)
        (marker / f"row-{i}").write_text("ran")
        return f"d{i}"

    return rows(spark, range(4)).select(
        "id", F.udf(touch, StringType(), useArrow=False)("id").alias("day")
    )


@local_only
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"txnAppId": "a"}, "txnAppId and txnVersion go together"),
        ({"txnAppId": "a", "txnVersion": "-1"}, "txnVersion must be a non-negative integer"),
        ({"versionAsOf": "1"}, "versionAsOf is for reads"),
        ({"createIfMissing": "yes"}, "createIfMissing must be true or false"),
        ({"createIfMissing": "true"}, "createIfMissing needs option warehouse"),
        (
            {"warehouse": "relative/dir"},
            "warehouse must be an absolute local path or s3://bucket/prefix",
        ),
        ({"gateway": "nohost"}, "gateway must be HOST:PORT"),
        (
            {"warehouse": "s3://Bad_Bucket/w", "createIfMissing": "true"},
            "'Bad_Bucket' is not a valid bucket name",
        ),
        ({"warehouse": "hdfs://nn/w"}, r"the scheme hdfs:// is not supported"),
        ({"partitionColumns": "id"}, "does not match table"),
        ({"txnAppld": "typo"}, "unknown option"),
    ],
)
def test_bad_write_options_are_refused_before_any_task_runs(
    ds: SparkSession, env: Env, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    table = env.table()
    writer = env.writer(_touching(ds, tmp_path / "ran"))
    for key, value in options.items():
        writer = writer.option(key, value)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match=message):
        writer.save(table)  # type: ignore[attr-defined]
    assert not (tmp_path / "ran").exists()
    assert env.lh.version(table) == 0
    assert job_folders(env, table) == []


@local_only
def test_missing_tables_bad_schemas_and_save_modes_are_refused_before_any_task_runs(
    ds: SparkSession, env: Env, tmp_path: Path
) -> None:
    table = env.table()
    marker = tmp_path / "ran"
    with pytest.raises(Exception, match="does not exist; create it"):
        env.writer(_touching(ds, marker)).save(f"missing{next(_names)}")  # type: ignore[attr-defined]
    wrong = _touching(ds, marker).withColumn("extra", F.lit(1))
    with pytest.raises(Exception, match=r"unexpected columns \['extra'\]"):
        env.writer(wrong).save(table)  # type: ignore[attr-defined]
    # Spark itself refuses the modes it cannot hand to a Python source, naming them.
    for mode, shown in (("error", "ErrorIfExists"), ("ignore", "Ignore")):
        with pytest.raises(Exception, match=f'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"{shown}"'):
            env.writer(_touching(ds, marker), mode).save(table)  # type: ignore[attr-defined]
    # No mode at all is Spark's default, ErrorIfExists: refused the same way.
    unset = _touching(ds, marker).write.format("percolake").option("gateway", env.gateway)
    with pytest.raises(
        Exception, match=r'cannot be written in the "ErrorIfExists" mode\. Please use either'
    ):
        unset.save(table)
    assert not marker.exists()
    assert env.lh.version(table) == 0
    with pytest.raises(Exception, match="give versionAsOf or timestampAsOf, not both"):
        env.reader(ds).option("versionAsOf", 0).option("timestampAsOf", "2024-01-01").load(table)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="timestampAsOf must be an ISO-8601 timestamp"):
        env.reader(ds).option("timestampAsOf", "yesterday").load(table)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="txnVersion is for batch writes"):
        env.reader(ds).option("txnVersion", 1).load(table)  # type: ignore[attr-defined]


# --- streaming ------------------------------------------------------------------------


def _json_batch(folder: Path, index: int, ids: range) -> None:
    lines = "".join(f'{{"id": {i}, "day": "d{i % 3}"}}\n' for i in ids)
    tmp = folder.parent / f".{folder.name}-{index}.json"
    tmp.write_text(lines)
    os.replace(tmp, folder / f"batch-{index:03d}.json")  # the source never sees half a file


def _run_stream(spark: SparkSession, env: Env, source: Path, ckpt: str, table: str) -> None:
    """One run of the query over whatever ``source`` holds now, a file per micro-batch."""
    sdf = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    query = (
        sdf.writeStream.format("percolake")
        .option("gateway", env.gateway)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start(table)
    )
    try:
        assert query.awaitTermination(STREAM_WAIT_S), "the query did not finish in time"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()


def test_a_restarted_stream_commits_every_micro_batch_exactly_once(
    ds: SparkSession, env: Env, tmp_path: Path
) -> None:
    """With an S3 warehouse the checkpoint is on S3 too (``s3a://``, written by Spark
    through hadoop-aws): the query id that names the stream is read from there, and
    a replayed micro-batch adds nothing wherever the checkpoint lives."""
    table = env.table()
    source = tmp_path / "in"
    if is_object_store(env.warehouse):
        ckpt = spark_path(f"{env.warehouse}-checkpoints/{table}")
    else:
        ckpt = str(tmp_path / "ckpt")
    commits = join(normalize_location(ckpt), "commits")
    source.mkdir()
    # Two micro-batches, the last replayed, then one new one: each micro-batch costs
    # seconds (issue 29), and this is the fewest that show the replay adding nothing
    # between batches that do add.
    for k in range(2):
        _json_batch(source, k, range(10 * k, 10 * k + 10))
    _run_stream(ds, env, source, ckpt, table)
    assert env.lh.version(table) == 2
    # A crash after the sink committed batch 1 but before Spark logged it: the restart
    # replays batch 1, which must add nothing.
    logged = [posixpath.basename(f.path) for f in filesystem.list_files(commits)]
    last = max(int(name) for name in logged if name.isdigit())
    assert last == 1
    assert filesystem.delete_file(join(commits, str(last)))
    filesystem.delete_file(join(commits, f".{last}.crc"))  # Hadoop's local checksum, if any
    _json_batch(source, 2, range(20, 30))
    _run_stream(ds, env, source, ckpt, table)
    history = env.lh.history(table)[1:]
    assert [c.batch_id for c in history] == [0, 1, 2]
    assert len({c.app_id for c in history}) == 1  # the query id, kept in the checkpoint
    got = env.reader(ds).load(table)  # type: ignore[attr-defined]
    assert got.count() == 30
    assert ids_of(got) == list(range(30))


def test_complete_mode_overwrites_each_micro_batch(
    ds: SparkSession, env: Env, tmp_path: Path
) -> None:
    table = env.table()
    source, ckpt = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    for k in range(2):
        _json_batch(source, k, range(10 * k, 10 * k + 10))
    counts = (
        ds.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy("day")
        .agg(F.count("*").alias("id"))
        .select("id", "day")
    )
    query = (
        counts.writeStream.format("percolake")
        .outputMode("complete")
        .option("gateway", env.gateway)
        .option("txnAppId", "daily-counts")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start(table)
    )
    try:
        assert query.awaitTermination(STREAM_WAIT_S)
    finally:
        query.stop()
    history = env.lh.history(table)[1:]
    assert [(c.operation, c.app_id, c.batch_id) for c in history] == [
        ("OVERWRITE", "daily-counts", 0),
        ("OVERWRITE", "daily-counts", 1),
    ]
    got = env.reader(ds).load(table)  # type: ignore[attr-defined]
    assert sorted((r["day"], r["id"]) for r in got.collect()) == [("d0", 7), ("d1", 7), ("d2", 6)]
    shutil.rmtree(ckpt)
