"""What only an ``s3://`` warehouse has: its refusals, and objects that are never renamed.

Everything else a lakehouse does runs on both stores in the parametrized suites
(``warehouse`` in tests/conftest.py). Here: a bad URL, a missing bucket and refused
credentials fail at ``Lakehouse(...)``, before anything is committed, naming the
problem; a Spark job writes each object once at its final key (no ``_temporary``,
nothing renamed); a failed Spark job whose driver dies leaves only objects of its
job folder, which vacuum removes later, and no version ever names a missing object.
All against the session's real MinIO (tests/s3_plugin.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from percolake.tools.s3 import S3Server
from spark_integration import DataFile, Lakehouse, Retention
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.locations import join
from spark_integration.spark import filesystem
from spark_integration.spark.hook import new_job
from txn import TransactionConfig, TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.s3]

TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)
SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


@pytest.fixture
def tm(tmp_path: Path) -> Iterator[TransactionManager]:
    manager = TransactionManager.embedded(f"sqlite:///{tmp_path}/store.db", config=TEST_CONFIG)
    yield manager
    manager.close()


def rows(spark: SparkSession, ids: range) -> DataFrame:
    return spark.createDataFrame([(i, f"x{i}") for i in ids], SCHEMA)


def ids_of(df: DataFrame) -> list[int]:
    return sorted(r["id"] for r in df.select("id").collect())


def objects(lh: Lakehouse, table: str) -> set[str]:
    return {f.path for f in filesystem.list_files(join(lh.warehouse, table))}


def settled_objects(lh: Lakehouse, table: str, quiet_s: float = 1.0) -> set[str]:
    """The objects once no more arrive: a failed job's other tasks may still finish
    their uploads after the driver has given up on the job (stragglers)."""
    deadline = time.monotonic() + 60
    seen = objects(lh, table)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = objects(lh, table)
        if now == seen:
            return now
        seen = now
    raise AssertionError(f"objects of {table} still changing after 60 s")


def assert_every_version_reads_its_objects(lh: Lakehouse, table: str) -> None:
    """No committed version names an object that is not there."""
    for commit in lh.history(table):
        missing = [f.path for f in lh.files(table, commit.version) if not filesystem.exists(f.path)]
        assert missing == [], f"version {commit.version} names missing objects {missing}"


# --- refusals at Lakehouse(...) -------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("hdfs://namenode/warehouse", "hdfs:// is not supported"),
        ("s3://Bad_Bucket/warehouse", "'Bad_Bucket' is not a valid bucket name"),
        ("s3://", "names no bucket"),
        ("s3:///warehouse", "names no bucket"),
    ],
)
def test_a_bad_url_fails_at_construction_naming_it(
    tm: TransactionManager, s3_warehouse: str, url: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        Lakehouse(tm, url)
    assert Lakehouse(tm, s3_warehouse).list_tables() == []


def test_a_missing_bucket_fails_at_construction_naming_it(
    tm: TransactionManager, s3_server: S3Server, s3_bucket: str
) -> None:
    missing = f"{s3_bucket}-missing"
    with pytest.raises(OSError, match=f"bucket '{missing}' does not exist") as info:
        Lakehouse(tm, f"s3://{missing}/warehouse")
    assert s3_server.endpoint_url in str(info.value)
    assert Lakehouse(tm, f"s3://{s3_bucket}/warehouse").list_tables() == []


def test_refused_credentials_fail_at_construction_naming_them(
    tm: TransactionManager, s3_warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(OSError, match="credentials") as info:
        Lakehouse(tm, s3_warehouse)
    assert "not-the-secret" not in str(info.value)  # a secret is never echoed
    monkeypatch.undo()
    assert Lakehouse(tm, s3_warehouse).list_tables() == []


def test_s3a_is_an_alias_recorded_as_s3(tm: TransactionManager, s3_warehouse: str) -> None:
    lh = Lakehouse(tm, "s3a://" + s3_warehouse.removeprefix("s3://"))
    assert lh.warehouse == s3_warehouse
    lh.create_table("t", SCHEMA)
    assert lh.files("t") == []


# --- writes: each object once, at its final key ---------------------------------------


@pytest.mark.spark
def test_a_spark_write_puts_each_object_once_at_its_final_key(
    tm: TransactionManager, s3_warehouse: str, spark: SparkSession
) -> None:
    lh = Lakehouse(tm, s3_warehouse)
    lh.create_table("p", "id BIGINT, name STRING, day INT", partition_by=["day"])
    df = spark.range(0, 60, 1, 3).select(
        F.col("id"),
        F.concat(F.lit("x"), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 3).cast("int").alias("day"),
    )
    assert lh.append("p", df) == 1
    committed = {f.path for f in lh.files("p")}
    # What the tasks wrote is exactly what the version names: no _temporary copies, no
    # _SUCCESS, nothing left for a rename to move.
    assert objects(lh, "p") == committed
    assert all("/_lh_job=" in p and "/day=" in p and "_temporary" not in p for p in committed)
    assert ids_of(lh.read(spark, "p")) == list(range(60))
    assert ids_of(lh.read(spark, "p").where("day = 1")) == list(range(1, 60, 3))


# --- a failed job on S3 ---------------------------------------------------------------


@pytest.mark.spark
def test_a_failed_job_leaves_only_staged_objects_that_vacuum_removes(
    tm: TransactionManager,
    s3_warehouse: str,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tasks put their objects, one fails, and the driver dies as it starts removing
    the job folder (the removal is where the crash lands): the objects of the tasks
    that finished, stragglers included, stay invisible until vacuum removes them."""
    lh = Lakehouse(tm, s3_warehouse)
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(3)))
    committed = objects(lh, "t")

    def explode_on_bad_row(i: int) -> str:
        if i == 35:
            raise RuntimeError("task crash on row 35")
        return f"x{i}"

    explode = F.udf(explode_on_bad_row, StringType(), useArrow=False)
    failing = spark.range(0, 40, 1, 4).select(F.col("id"), explode(F.col("id")).alias("name"))

    def driver_dies(folder: str) -> None:
        raise fp.SimulatedCrash(f"driver died removing {folder}")

    with monkeypatch.context() as patch:
        patch.setattr(filesystem, "delete_tree", driver_dies)
        with pytest.raises(fp.SimulatedCrash):
            lh.append("t", failing)
    staged = settled_objects(lh, "t") - committed
    assert staged, "the tasks that finished left their objects"
    assert all("/_lh_job=" in p for p in staged)
    assert lh.version("t") == 1
    assert ids_of(lh.read(spark, "t")) == [0, 1, 2]
    assert_every_version_reads_its_objects(lh, "t")
    # Younger than the retention: kept (a job could still be running).
    assert lh.vacuum("t", retain_seconds=3600) == []
    assert objects(lh, "t") == committed | staged
    # Older: the staged objects go, by the start time in their job folder's name.
    assert set(lh.vacuum("t", retain_seconds=0)) == staged
    assert objects(lh, "t") == committed
    assert_every_version_reads_its_objects(lh, "t")
    assert lh.append("t", rows(spark, range(3, 5))) == 2
    assert ids_of(lh.read(spark, "t")) == [0, 1, 2, 3, 4]


# --- files written by other tools, history, expiry ------------------------------------


def test_append_files_history_expiry_and_vacuum_on_s3(
    tm: TransactionManager, s3_warehouse: str
) -> None:
    lh = Lakehouse(tm, s3_warehouse)
    # A StructType, not "id BIGINT": parsing a DDL string needs an active SparkSession,
    # which this test does not take (it passed only after a Spark test in its worker).
    ids = StructType([StructField("id", LongType())])
    lh.create_table("t", ids, retention=Retention(log_retention_s=0))
    written: list[list[DataFile]] = []
    for version in (1, 2, 3):
        job = new_job(join(lh.warehouse, "t"))
        path = join(job.staging, "part-0.parquet")
        fs, fs_path = filesystem.resolve(path)
        pq.write_table(pa.table({"id": pa.array([version], pa.int64())}), fs_path, filesystem=fs)
        files = [DataFile(path, filesystem.file_size(path), 1)]
        written.append(files)
        assert lh.append_files("t", files) == version
    assert [f.path for f in lh.files("t")] == [f[0].path for f in written]
    history = lh.history("t")
    assert [c.added_files for c in history[1:]] == [(f[0].path,) for f in written]
    assert all(p.startswith(s3_warehouse + "/t/_lh_job=") for c in history for p in c.added_files)
    # Every version was replaced at once (no log retention): expiry keeps the latest.
    assert lh.expire("t").readable_from == 3
    # The files stay: the latest version names them all.
    assert lh.vacuum("t", retain_seconds=0) == []
    assert_every_version_reads_its_objects(lh, "t")
    assert sorted(
        i
        for f in lh.files("t")
        for i in filesystem.parquet_file(f.path).read().column("id").to_pylist()
    ) == [1, 2, 3]


# --- the s3a settings Spark sessions get -----------------------------------------------


def test_s3a_settings_come_from_the_aws_variables_and_carry_no_secret() -> None:
    """``s3a_conf`` maps the standard variables onto s3a: an endpoint turns on path-style
    addressing with SSL as its scheme says, the region is passed on, requests are
    bounded, and no credential ever lands in the Spark conf (shown in UIs and logs)."""
    from spark_integration import s3a_conf

    secret = "do-not-copy-me"
    local = s3a_conf(
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_REGION": "eu-west-1",
            "AWS_ACCESS_KEY_ID": "key",
            "AWS_SECRET_ACCESS_KEY": secret,
        }
    )
    assert local["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert local["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert local["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert local["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert local["spark.hadoop.fs.s3a.attempts.maximum"] == "3"
    assert local["spark.hadoop.fs.s3a.connection.establish.timeout"] == "5s"
    assert not any(secret in value or value == "key" for value in local.values())
    assert "hadoop-aws-" in local["spark.driver.extraClassPath"]

    aws = s3a_conf({"AWS_ENDPOINT_URL_S3": "https://s3.example.com", "AWS_REGION": "us-east-2"})
    assert aws["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    assert "spark.hadoop.fs.s3a.endpoint" not in s3a_conf({})
    with pytest.raises(ValueError, match="expected an http:// or https:// URL"):
        s3a_conf({"AWS_ENDPOINT_URL": "ftp://127.0.0.1:9000"})
