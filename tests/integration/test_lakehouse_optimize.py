"""Compaction (``lh.optimize``) end to end: a real local Spark session, an embedded
manager and a real gateway process (``percolake serve``), a local warehouse.

Tables are partitioned by ``day`` and fed by appends of two files per day, so each
day holds several small files. Concurrent commits are staged with the
``before_commit`` fail point: the compaction has written its files when the other
commit lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from spark_integration import ConcurrentModificationError, DmlResult, Lakehouse, register
from spark_integration.engine import lakehouse_failpoints as fp
from tests.integration.lakehouse_tables import SCHEMA, job_folders, table_rows
from tests.servers import ServerProcess
from tests.spark_plugin import STREAM_POLL_INTERVAL
from txn import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DAYS = ("d1", "d2")
STREAM_WAIT_S = 120


def rows_of(ids: range) -> list[tuple[int, int, str]]:
    return [(i, i * 10, DAYS[i % 2]) for i in ids]


def append(lh: Lakehouse, spark: SparkSession, ids: range, name: str = "events") -> int:
    """An append of about two files per day (the local session's two slices of the
    rows, each holding rows of both days)."""
    return lh.append(name, spark.createDataFrame(rows_of(ids), SCHEMA))


def files_by_day(lh: Lakehouse, name: str = "events") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in lh.files(name):
        out.setdefault(str(f.partition["day"]), []).append(f.path)
    return out


def small_table(lh: Lakehouse, spark: SparkSession) -> dict[str, int]:
    """Versions 1-3: three appends, several small files per day; the count per day."""
    lh.create_table("events", SCHEMA, partition_by="day")
    for start in (0, 10, 20):
        append(lh, spark, range(start, start + 10))
    counts = {day: len(paths) for day, paths in files_by_day(lh).items()}
    assert set(counts) == set(DAYS) and min(counts.values()) >= 3
    return counts


def test_compaction_rewrites_small_files_into_one_per_partition_and_changes_no_row(
    lh: Lakehouse, spark: SparkSession
) -> None:
    counts = small_table(lh, spark)

    # A partition predicate compacts only its partition.
    got = lh.optimize("events", "day = 'd1'", spark=spark)
    assert got == DmlResult(4, files_added=1, files_removed=counts["d1"])
    assert {day: len(paths) for day, paths in files_by_day(lh).items()} == {
        "d1": 1,
        "d2": counts["d2"],
    }
    assert lh.optimize("events") == DmlResult(5, files_added=1, files_removed=counts["d2"])
    assert {day: len(paths) for day, paths in files_by_day(lh).items()} == {"d1": 1, "d2": 1}

    # Nothing left to do: no commit, the current version and no files.
    assert lh.optimize("events") == DmlResult(5)
    assert lh.version("events") == 5

    # Every version reads the rows it had; the compactions read as version 3.
    for version in range(1, 6):
        assert table_rows(lh, spark, version) == sorted(rows_of(range(10 * min(version, 3))))
    history = lh.history("events")
    assert [h.operation for h in history][-2:] == ["OPTIMIZE", "OPTIMIZE"]
    assert len(history[5].added_files) == 1 and len(history[5].removed_files) == counts["d2"]


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)  # one path packs either way
def test_compaction_packs_files_up_to_the_target_size_and_leaves_large_files(
    lh: Lakehouse, spark: SparkSession
) -> None:
    small_table(lh, spark)
    sizes = [f.size_bytes for f in lh.files("events") if f.partition["day"] == "d1"]
    # Room for any two of d1's files in a bin but not for three (they are of a size).
    assert 3 * min(sizes) > 2 * max(sizes)
    n = len(sizes)
    got = lh.optimize("events", "day = 'd1'", target_file_mb=2 * max(sizes) / (1 << 20))
    # Pairs; an odd file out is a bin of one, left as it is.
    assert (got.files_added, got.files_removed) == (n // 2, n - n % 2)
    assert len(files_by_day(lh)["d1"]) == n // 2 + n % 2
    # Every file is now at or above a target of the smallest one's size: nothing to do.
    smallest = min(f.size_bytes for f in lh.files("events")) / (1 << 20)
    assert lh.optimize("events", target_file_mb=smallest) == DmlResult(got.version)
    assert table_rows(lh, spark) == sorted(rows_of(range(30)))


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)  # checked before any call
def test_bad_optimize_calls_are_refused_before_anything_is_written(
    lh: Lakehouse, spark: SparkSession
) -> None:
    small_table(lh, spark)
    folders = job_folders(lh)
    with pytest.raises(ValueError, match="invalid table name"):
        lh.optimize("no/such", spark=spark)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="target_file_mb must be positive"):
            lh.optimize("events", target_file_mb=bad, spark=spark)
    for wrong in ("128", True, None):
        with pytest.raises(TypeError, match="target_file_mb must be a number"):
            lh.optimize("events", target_file_mb=wrong, spark=spark)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partition columns"):
        lh.optimize("events", "amount > 5", spark=spark)
    with pytest.raises(ValueError, match="partition columns"):
        lh.optimize("events", "day = 'd1' OR day = 'd2'", spark=spark)
    with pytest.raises(ValueError, match="invalid predicate"):
        lh.optimize("events", "nope = 1", spark=spark)
    assert lh.version("events") == 3
    assert job_folders(lh) == folders


def test_compaction_commits_beside_an_append_and_loses_to_a_delete_of_a_file_it_rewrote(
    lh: Lakehouse, spark: SparkSession
) -> None:
    counts = small_table(lh, spark)

    # An append to the very partition it compacts lands while it is about to commit.
    lh.failpoints.enable(fp.BEFORE_COMMIT, lambda _: append(lh, spark, range(30, 32)), times=1)
    got = lh.optimize("events", "day = 'd1'")
    assert got == DmlResult(5, files_added=1, files_removed=counts["d1"])
    assert len(files_by_day(lh)["d1"]) == 2  # the compacted file and the append's
    assert table_rows(lh, spark) == sorted(rows_of(range(32)))

    # A DELETE rewrites a file of d2 while the compaction of d2 is about to commit.
    folders = job_folders(lh)
    lh.failpoints.enable(fp.BEFORE_COMMIT, lambda _: lh.delete("events", "id = 1"), times=1)
    with pytest.raises(ConcurrentModificationError, match="rewritten or removed"):
        lh.optimize("events", "day = 'd2'")
    assert lh.version("events") == 6  # the delete's; the compaction committed nothing
    assert len(job_folders(lh)) == len(folders) + 1  # the delete's; the compaction's went
    assert table_rows(lh, spark) == sorted(r for r in rows_of(range(32)) if r[0] != 1)

    # A DELETE that read a file the compaction removes loses as to any rewrite.
    lh.failpoints.enable(fp.BEFORE_COMMIT, lambda _: lh.optimize("events"), times=1)
    with pytest.raises(ConcurrentModificationError, match="rewritten or removed"):
        lh.delete("events", "id = 3")
    assert lh.version("events") == 7
    assert {day: len(paths) for day, paths in files_by_day(lh).items()} == {"d1": 1, "d2": 1}
    assert table_rows(lh, spark) == sorted(r for r in rows_of(range(32)) if r[0] != 1)


@pytest.fixture
def gateway_lh(sqlite_gateway: ServerProcess, tmp_path: Path) -> Iterator[Lakehouse]:
    """The module's gateway with its default catalog, which the data source reads."""
    tm = TransactionManager.remote(sqlite_gateway.address)
    yield Lakehouse(tm, str(tmp_path / "warehouse"))
    tm.close()


def test_streams_skip_compaction_versions_without_emitting_rows_again(
    gateway_lh: Lakehouse, sqlite_gateway: ServerProcess, spark: SparkSession, tmp_path: Path
) -> None:
    lh = gateway_lh
    register(spark)
    small_table(lh, spark)

    def stream(**options: str) -> object:
        reader = spark.readStream.format("percolake").option("gateway", sqlite_gateway.address)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load("events")

    def ids(sink: str) -> list[int]:
        return sorted(r["id"] for r in spark.sql(f"select id from {sink}").collect())

    # A stream running from before the compaction: its rows arrive once.
    running = (
        stream()
        .writeStream.format("memory")  # type: ignore[attr-defined]
        .queryName("before_optimize")
        .option("checkpointLocation", str(tmp_path / "ckpt-running"))
        .trigger(processingTime=STREAM_POLL_INTERVAL)
        .start()
    )
    try:
        running.processAllAvailable()
        assert ids("before_optimize") == list(range(30))
        assert lh.optimize("events").version == 4
        append(lh, spark, range(30, 34))  # version 5
        running.processAllAvailable()
        assert running.exception() is None
        assert ids("before_optimize") == list(range(34))
    finally:
        running.stop()

    # A stream reading changes across the compaction version: no error, no repeat.
    changes = (
        stream(startingVersion="0")
        .writeStream.format("memory")  # type: ignore[attr-defined]
        .queryName("from_zero")
        .option("checkpointLocation", str(tmp_path / "ckpt-changes"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert changes.awaitTermination(STREAM_WAIT_S), "the query did not finish in time"
        assert changes.exception() is None
    finally:
        changes.stop()
    assert ids("from_zero") == list(range(34))
