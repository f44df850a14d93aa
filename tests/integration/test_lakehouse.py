"""Lakehouse tables end to end: a real local Spark session over an embedded manager.

The manager is made in exactly one fixture (``lakehouse_tm``) so that the same
tests can run over other stores and the remote manager by parametrizing it. The
warehouse comes from ``warehouse`` (tests/conftest.py): tests that exercise file
paths (writes, reads, crashes, vacuum) also run on ``s3://`` on the session's
MinIO (``ON_BOTH_STORES``, with the SQLite manager: the manager and the store are
independent, so their product would only repeat tests); tests of catalog logic
alone (races, replays, refusals) run on a local folder (``LOCAL``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import (
    ConcurrentModificationError,
    Lakehouse,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
    write_cells,
)
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.locations import is_object_store, join
from spark_integration.spark import filesystem
from txn import TransactionConfig, TransactionManager
from txn.errors import TransactionConflictError

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Short waits on stalled committers keep failure cases fast; none affects safety.
TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])

#: File paths matter: every manager on a local warehouse, and S3 with SQLite.
ON_BOTH_STORES = pytest.mark.parametrize(
    ("lakehouse_tm", "warehouse"),
    [
        ("sqlite", "local"),
        ("remote-sqlite", "local"),
        pytest.param("cassandra", "local", marks=pytest.mark.cassandra),
        pytest.param("sqlite", "s3", marks=pytest.mark.s3),
    ],
    indirect=True,
)
#: Catalog logic only: the store of the files makes no difference.
LOCAL = pytest.mark.parametrize("warehouse", ["local"], indirect=True)


@pytest.fixture(
    params=["sqlite", "remote-sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)]
)
def lakehouse_tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    """The manager the lakehouse commits through: embedded on SQLite and on Cassandra,
    and remote through a real gateway process."""
    if request.param == "remote-sqlite":
        from tests.servers import ServerProcess

        server = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/gw.db"], tmp_path).start()
        remote = TransactionManager.remote(server.address)
        yield remote
        remote.close()
        server.stop()
        return
    url = (
        str(request.getfixturevalue("cassandra_store_url"))
        if request.param == "cassandra"
        else f"sqlite:///{tmp_path}/store.db"
    )
    manager = TransactionManager.embedded(url, config=TEST_CONFIG)
    yield manager
    manager.close()


@pytest.fixture
def lh(lakehouse_tm: TransactionManager, warehouse: str) -> Lakehouse:
    return Lakehouse(lakehouse_tm, warehouse)


def rows(spark: SparkSession, ids: range | list[int], tag: str = "x") -> DataFrame:
    return spark.createDataFrame([(i, f"{tag}{i}") for i in ids], SCHEMA)


def ids_of(df: DataFrame) -> list[int]:
    return sorted(r["id"] for r in df.select("id").collect())


def job_folders(lh: Lakehouse, table: str) -> list[str]:
    # On S3 a "folder" is a prefix: it exists while an object lies below it.
    names = (p.rsplit("/", 1)[-1] for p in filesystem.list_dirs(join(lh.warehouse, table)))
    return sorted(n for n in names if n.startswith("_lh_job="))


def all_files_on_disk(lh: Lakehouse, table: str) -> set[str]:
    stored = filesystem.list_files(join(lh.warehouse, table))
    return {f.path for f in stored if f.path.endswith(".parquet")}


def exists(path: str) -> bool:
    return filesystem.exists(path)


# --- basics ---------------------------------------------------------------------------


@ON_BOTH_STORES
def test_append_read_and_dense_versions(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)
    assert lh.version("t") == 0
    assert lh.read(spark, "t").count() == 0
    assert lh.files("t") == []
    assert lh.append("t", rows(spark, range(0, 10))) == 1
    # Column order of the DataFrame does not matter, names and types do.
    assert lh.append("t", rows(spark, range(10, 25)).select("name", "id")) == 2
    got = lh.read(spark, "t")
    assert got.schema.fieldNames() == ["id", "name"]
    assert ids_of(got) == list(range(25))
    files = lh.files("t")
    assert sum(f.record_count for f in files) == 25
    assert all(f.path.startswith(lh.warehouse + "/t/_lh_job=") for f in files)
    assert all(filesystem.file_size(f.path) == f.size_bytes for f in files)
    # Statistics come from the footers the tasks wrote (they serve pruning).
    assert all(f.stats is not None and f.stats["id"].min_value is not None for f in files)
    assert all(f.partition == {} for f in files)


@ON_BOTH_STORES
def test_partitioned_table(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("p", "id BIGINT, region STRING, day INT", partition_by=["region", "day"])
    df = spark.createDataFrame(
        [(1, "eu", 1), (2, "eu", 2), (3, "us/west=1", 1), (4, None, 2), (5, "100%", 1)],
        "id long, region string, day int",
    )
    assert lh.append("p", df) == 1
    partitions = sorted(
        (str(f.partition["region"]), str(f.partition["day"]), f.record_count) for f in lh.files("p")
    )
    assert partitions == [
        ("100%", "1", 1),
        ("None", "2", 1),
        ("eu", "1", 1),
        ("eu", "2", 1),
        ("us/west=1", "1", 1),
    ]
    got = lh.read(spark, "p")
    assert got.schema.fieldNames() == ["id", "region", "day"]
    assert dict(got.dtypes) == {"id": "bigint", "region": "string", "day": "int"}
    assert sorted(tuple(r) for r in got.collect()) == sorted(tuple(r) for r in df.collect())
    assert ids_of(got.where(F.col("region") == "eu")) == [1, 2]


# --- atomic visibility ----------------------------------------------------------------


def _exploding_rows(spark: SparkSession, bad_id: int) -> DataFrame:
    def explode_on_bad_row(i: int) -> str:
        if i == bad_id:
            raise RuntimeError(f"task crash on row {i}")
        return f"x{i}"

    # Not Arrow-optimized: that path needs pandas, which the spark extra does not bring.
    explode_on = F.udf(explode_on_bad_row, StringType(), useArrow=False)
    return spark.range(0, 40, 1, 4).select(F.col("id"), explode_on(F.col("id")).alias("name"))


@ON_BOTH_STORES
def test_task_crash_leaves_nothing_visible(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(3)))
    before_files = lh.files("t")
    # Partitions without the bad row finish and write their files; the job still fails.
    with pytest.raises(Exception, match="task crash on row 35"):
        lh.append("t", _exploding_rows(spark, bad_id=35))
    assert lh.version("t") == 1
    assert lh.files("t") == before_files
    assert ids_of(lh.read(spark, "t")) == [0, 1, 2]
    assert [c.version for c in lh.history("t")] == [0, 1]
    assert lh.append("t", rows(spark, range(3, 5))) == 2


@ON_BOTH_STORES
@pytest.mark.parametrize("point", [fp.AFTER_WRITE, fp.BEFORE_COMMIT])
def test_driver_crash_between_write_and_commit(
    lh: Lakehouse, spark: SparkSession, point: str
) -> None:
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(3)))
    committed_files = {f.path for f in lh.files("t")}
    lh.failpoints.enable(point, fp.crash(), times=1)
    with pytest.raises(fp.SimulatedCrash):
        lh.append("t", rows(spark, range(100, 200)))
    # The dead job's files are on disk, and invisible.
    orphans = all_files_on_disk(lh, "t") - committed_files
    assert orphans
    assert lh.version("t") == 1
    assert {f.path for f in lh.files("t")} == committed_files
    assert ids_of(lh.read(spark, "t")) == [0, 1, 2]
    # Too young for the retention: kept (the job might still be running).
    assert lh.vacuum("t", retain_seconds=3600) == []
    assert orphans <= all_files_on_disk(lh, "t")
    # Past the retention: the orphans and their job folder go, committed files stay.
    removed = lh.vacuum("t", retain_seconds=0)
    assert orphans <= set(removed)
    assert all_files_on_disk(lh, "t") == committed_files
    assert ids_of(lh.read(spark, "t")) == [0, 1, 2]


@ON_BOTH_STORES
def test_failed_commit_removes_its_staging_folder(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)

    def fail(job_id: str) -> None:
        raise RuntimeError("commit path failed")

    lh.failpoints.enable(fp.BEFORE_COMMIT, fail, times=1)
    with pytest.raises(RuntimeError, match="commit path failed"):
        lh.append("t", rows(spark, range(5)))
    assert job_folders(lh, "t") == []
    assert lh.version("t") == 0


# --- concurrency ----------------------------------------------------------------------


def run_threads(*targets: Callable[[], Any]) -> list[Any]:
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def wrap(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i, t)) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    if errors:
        raise errors[0]
    return results


@LOCAL
def test_concurrent_appenders_all_land(
    lakehouse_tm: TransactionManager, lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("t", SCHEMA)
    writers, appends_each = 4, 2
    # One Lakehouse per writer, as separate drivers would have: their commits race
    # through the transaction protocol instead of taking turns inside one object.
    drivers = [Lakehouse(lakehouse_tm, lh.warehouse) for _ in range(writers)]

    def writer(w: int) -> list[int]:
        return [
            drivers[w].append("t", rows(spark, range(100 * w + 10 * k, 100 * w + 10 * k + 5)))
            for k in range(appends_each)
        ]

    got = run_threads(*[lambda w=w: writer(w) for w in range(writers)])
    versions = sorted(v for vs in got for v in vs)
    assert versions == list(range(1, writers * appends_each + 1))
    assert lh.version("t") == writers * appends_each
    expected = sorted(
        i
        for w in range(writers)
        for k in range(appends_each)
        for i in range(100 * w + 10 * k, 100 * w + 10 * k + 5)
    )
    assert ids_of(lh.read(spark, "t")) == expected
    assert [c.version for c in lh.history("t")] == list(range(writers * appends_each + 1))


@LOCAL
def test_idempotent_replay(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)
    assert lh.append("t", rows(spark, range(5)), app_id="etl", batch_id=1) == 1
    files = lh.files("t")
    assert lh.append("t", rows(spark, range(5)), app_id="etl", batch_id=1) == 1
    assert lh.files("t") == files
    assert lh.append("t", rows(spark, range(5, 7)), app_id="etl", batch_id=2) == 2
    assert lh.append("t", rows(spark, range(7, 9)), app_id="other", batch_id=1) == 3
    assert lh.overwrite("t", rows(spark, range(3)), app_id="etl", batch_id="reset") == 4
    assert lh.overwrite("t", rows(spark, range(50)), app_id="etl", batch_id="reset") == 4
    assert lh.append("t", rows(spark, range(5)), app_id="etl", batch_id=1) == 1
    assert ids_of(lh.read(spark, "t")) == [0, 1, 2]
    marks = [(c.app_id, c.batch_id) for c in lh.history("t")]
    assert marks == [(None, None), ("etl", 1), ("etl", 2), ("other", 1), ("etl", "reset")]
    with pytest.raises(ValueError, match="together"):
        lh.append("t", rows(spark, range(1)), app_id="etl")


@ON_BOTH_STORES
def test_idempotent_replay_racing_its_original(
    lakehouse_tm: TransactionManager, lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("t", SCHEMA)
    both_written = threading.Barrier(2, timeout=120)
    original, replay = Lakehouse(lakehouse_tm, lh.warehouse), Lakehouse(lakehouse_tm, lh.warehouse)
    # Both jobs pass the early mark check, write their files, then commit together.
    for driver in (original, replay):
        driver.failpoints.enable(fp.BEFORE_COMMIT, lambda job_id: both_written.wait())

    def job(driver: Lakehouse) -> int:
        return driver.append("t", rows(spark, range(10)), app_id="stream", batch_id=7)

    first, second = run_threads(lambda: job(original), lambda: job(replay))
    assert first == second == 1
    assert lh.version("t") == 1
    assert ids_of(lh.read(spark, "t")) == list(range(10))
    # The loser's files were never committed and its folder is gone.
    assert len(job_folders(lh, "t")) == 1


@LOCAL
def test_overwrite_racing_an_append_fails_and_loses_nothing(
    lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(5)))
    appended: list[int] = []
    # While the overwrite's files are written, an append commits.
    lh.failpoints.enable(
        fp.BEFORE_COMMIT,
        lambda job_id: appended.append(lh.append("t", rows(spark, range(100, 103)))),
        times=1,
    )
    with pytest.raises(ConcurrentModificationError, match="based on version 1") as info:
        lh.overwrite("t", rows(spark, range(1000, 1010)))
    assert isinstance(info.value, TransactionConflictError)
    assert appended == [2]
    assert lh.version("t") == 2
    assert ids_of(lh.read(spark, "t")) == [0, 1, 2, 3, 4, 100, 101, 102]
    # Re-run on the new version: it replaces everything.
    assert lh.overwrite("t", rows(spark, range(1000, 1010))) == 3
    assert ids_of(lh.read(spark, "t")) == list(range(1000, 1010))


@LOCAL
def test_append_racing_an_overwrite_lands_after_it(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(5)))
    lh.failpoints.enable(
        fp.BEFORE_COMMIT,
        lambda job_id: lh.overwrite("t", rows(spark, range(50, 52))),
        times=1,
    )
    # The blind append retries at the head and commits on top of the overwrite.
    assert lh.append("t", rows(spark, range(100, 103))) == 3
    assert ids_of(lh.read(spark, "t")) == [50, 51, 100, 101, 102]
    assert [c.operation for c in lh.history("t")] == ["CREATE TABLE", "WRITE", "OVERWRITE", "WRITE"]


# --- time travel and history ----------------------------------------------------------


@ON_BOTH_STORES
def test_time_travel_reads_exactly_each_version(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)
    expected = {0: []}
    lh.append("t", rows(spark, range(0, 4)))
    expected[1] = list(range(0, 4))
    lh.append("t", rows(spark, range(4, 6)))
    expected[2] = list(range(0, 6))
    lh.overwrite("t", rows(spark, range(10, 13)))
    expected[3] = list(range(10, 13))
    lh.append("t", rows(spark, range(13, 14)))
    expected[4] = list(range(10, 14))
    for version, ids in expected.items():
        assert ids_of(lh.read(spark, "t", version=version)) == ids, version
        assert sum(f.record_count for f in lh.files("t", version=version)) == len(ids)
    # By timestamp: each version's own commit time reads exactly that version.
    for commit in lh.history("t")[1:]:
        got = ids_of(lh.read(spark, "t", timestamp=commit.timestamp_ms))
        assert got == expected[commit.version], commit.version
    assert lh.files("t", version=4) == lh.files("t")
    assert {f.path for f in lh.files("t", version=1)} < {f.path for f in lh.files("t", version=2)}
    with pytest.raises(VersionNotFoundError, match="no version 5"):
        lh.read(spark, "t", version=5)
    with pytest.raises(ValueError):
        lh.files("t", version=-1)


@ON_BOTH_STORES
def test_history_lists_every_commit(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(3)), app_id="a", batch_id=0)
    v1_files = tuple(f.path for f in lh.files("t"))
    lh.append("t", rows(spark, range(3, 5)))
    v2_files = tuple(f.path for f in lh.files("t"))
    lh.overwrite("t", rows(spark, range(1)))
    history = lh.history("t")
    assert [(c.version, c.operation) for c in history] == [
        (0, "CREATE TABLE"),
        (1, "WRITE"),
        (2, "WRITE"),
        (3, "OVERWRITE"),
    ]
    assert history[1].added_files == v1_files
    assert set(history[2].added_files) == set(v2_files) - set(v1_files)
    assert set(history[3].removed_files) == set(v2_files)
    assert history[3].added_files == tuple(f.path for f in lh.files("t"))
    assert (history[1].app_id, history[1].batch_id) == ("a", 0)
    commit_tss = [c.commit_ts for c in history]
    assert all(isinstance(ts, int) for ts in commit_tss)
    assert commit_tss == sorted(commit_tss)
    assert [c.timestamp_ms for c in history] == sorted(c.timestamp_ms for c in history)


# --- vacuum ---------------------------------------------------------------------------


@ON_BOTH_STORES
def test_vacuum_keeps_what_versions_inside_the_retention_read(
    lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(5)))
    lh.append("t", rows(spark, range(5, 8)))
    lh.overwrite("t", rows(spark, range(100, 102)))
    old_files = {f.path for f in lh.files("t", version=2)}
    # Version 2 was replaced moments ago: inside an hour's retention, still readable.
    assert lh.vacuum("t", retain_seconds=3600) == []
    assert ids_of(lh.read(spark, "t", version=2)) == list(range(8))
    # With no retention only the latest version is kept.
    removed = set(lh.vacuum("t", retain_seconds=0))
    assert old_files <= removed
    assert not any(exists(p) for p in old_files)
    assert ids_of(lh.read(spark, "t")) == [100, 101]
    with pytest.raises(VersionNotFoundError, match="vacuum"):
        lh.read(spark, "t", version=2)
    assert lh.vacuum("t", retain_seconds=0) == []
    assert lh.append("t", rows(spark, range(200, 201))) == 4
    assert ids_of(lh.read(spark, "t")) == [100, 101, 200]


@ON_BOTH_STORES
def test_job_started_before_a_vacuum_cutoff_cannot_commit(
    lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("t", SCHEMA)
    lh.append("t", rows(spark, range(2)))
    # A vacuum runs while the job is between writing its files and committing them.
    lh.failpoints.enable(fp.BEFORE_COMMIT, lambda job_id: lh.vacuum("t", retain_seconds=0), times=1)
    with pytest.raises(ConcurrentModificationError, match="vacuum"):
        lh.append("t", rows(spark, range(10, 12)))
    assert ids_of(lh.read(spark, "t")) == [0, 1]
    assert all(exists(f.path) for f in lh.files("t"))


# --- refusals -------------------------------------------------------------------------


@LOCAL
def test_schema_mismatch_is_refused_before_any_file_is_written(
    lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("t", SCHEMA)
    bad = [
        spark.createDataFrame([(1,)], "id long"),
        spark.createDataFrame([(1, "a", 2)], "id long, name string, extra int"),
        spark.createDataFrame([(1, "a")], "id int, name string"),
        spark.createDataFrame([("1", "a")], "ID string, name string"),
    ]
    for df in bad:
        with pytest.raises(ValueError, match="does not match table 't'"):
            lh.append("t", df)
        with pytest.raises(ValueError, match="does not match table 't'"):
            lh.overwrite("t", df)
    assert job_folders(lh, "t") == []
    assert lh.version("t") == 0


@LOCAL
def test_missing_and_existing_tables(lh: Lakehouse, spark: SparkSession) -> None:
    assert lh.list_tables() == []
    lh.create_table("b.events", SCHEMA)
    lh.create_table("a_orders", "id BIGINT, name STRING")
    assert lh.list_tables() == ["a_orders", "b.events"]
    with pytest.raises(TableExistsError):
        lh.create_table("a_orders", SCHEMA)
    df = rows(spark, range(1))
    for call in (
        lambda: lh.append("nope", df),
        lambda: lh.overwrite("nope", df),
        lambda: lh.read(spark, "nope"),
        lambda: lh.files("nope"),
        lambda: lh.history("nope"),
        lambda: lh.vacuum("nope", 10),
        lambda: lh.version("nope"),
    ):
        with pytest.raises(TableNotFoundError):
            call()
    assert lh.list_tables() == ["a_orders", "b.events"]


@ON_BOTH_STORES
def test_create_refuses_a_location_with_files(lh: Lakehouse) -> None:
    filesystem.write_bytes(join(lh.warehouse, "t", "stray.parquet"), b"")
    with pytest.raises(TableExistsError, match="already holds files"):
        lh.create_table("t", SCHEMA)
    assert lh.list_tables() == []


@LOCAL
def test_arguments_are_validated_at_the_edge(lh: Lakehouse, spark: SparkSession) -> None:
    lh.create_table("t", SCHEMA)
    df = rows(spark, range(1))
    with pytest.raises(ValueError):
        lh.create_table("bad name", SCHEMA)
    with pytest.raises(ValueError):
        lh.create_table("..", SCHEMA)
    with pytest.raises(TypeError):
        lh.append(3, df)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lh.append("t", [(1, "a")])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lh.append("t", df, app_id="a", batch_id=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        lh.append("t", df, app_id="", batch_id=1)
    with pytest.raises(ValueError):
        lh.vacuum("t", -1)
    with pytest.raises(TypeError):
        lh.read("spark", "t")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partition column 'nope'"):
        lh.create_table("u", SCHEMA, partition_by=["nope"])
    with pytest.raises(ValueError, match="at least one column"):
        lh.create_table("u", SCHEMA, partition_by=["id", "name"])
    with pytest.raises(ValueError, match="reserved"):
        lh.create_table("u", "id BIGINT, _lh_job STRING")
    with pytest.raises(ValueError, match="invalid DDL"):
        lh.create_table("u", "id BIGINT,,")
    with pytest.raises(ValueError, match="absolute"):
        Lakehouse(lh._tm, "relative/path")
    assert not is_object_store(lh.warehouse)
    assert lh.list_tables() == ["t"]
    assert lh.version("t") == 0


def test_write_cells_refuses_what_executors_could_not_do(
    lakehouse_tm: TransactionManager, spark: SparkSession
) -> None:
    df = rows(spark, range(3))
    if not hasattr(lakehouse_tm, "address"):  # an embedded manager: executors cannot reach it
        with pytest.raises(ValueError, match="gateway"):
            write_cells(df, lakehouse_tm, "cells", row_col="id")
    with pytest.raises(ValueError, match="row_col"):
        write_cells(df, lakehouse_tm, "cells", row_col="nope", address="127.0.0.1:1")
    with pytest.raises(ValueError, match="row key column"):
        write_cells(df, lakehouse_tm, "cells", row_col="id", columns=["id"], address="h:1")
    with pytest.raises(ValueError):
        write_cells(df, lakehouse_tm, "bad table", row_col="id", address="h:1")
