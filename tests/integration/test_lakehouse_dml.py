"""DELETE and UPDATE on lakehouse tables, end to end: a real local Spark session, an
embedded manager and a real gateway process (``percolake serve``), a local warehouse.

Each table is partitioned by ``day`` with one file per day, so the tests can say
exactly which files a statement must leave alone. Concurrent statements are staged
with the ``before_commit`` fail point: the first statement has read and written its
files when the second one commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import ConcurrentModificationError, DmlResult, Lakehouse
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.locations import join
from spark_integration.spark import filesystem
from txn import TransactionConfig, TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("amount", LongType()),
        StructField("day", StringType()),
    ]
)
#: id, amount, day: three days, one file each, a negative amount in d1 and d2.
ROWS = [(1, 10, "d1"), (2, -5, "d1"), (3, 7, "d1"), (4, -1, "d2"), (5, 3, "d2"), (6, 8, "d3")]


@pytest.fixture(params=["embedded", "remote"])
def lh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lakehouse]:
    """A lakehouse on SQLite: embedded, or through a real gateway's lakehouse service."""
    if request.param == "remote":
        from tests.servers import ServerProcess

        server = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/gw.db"], tmp_path).start()
        remote = TransactionManager.remote(server.address)
        yield Lakehouse(remote, str(tmp_path / "warehouse"))
        remote.close()
        server.stop()
        return
    config = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)
    manager = TransactionManager.embedded(f"sqlite:///{tmp_path}/store.db", config=config)
    yield Lakehouse(manager, str(tmp_path / "warehouse"))
    manager.close()


def make_table(lh: Lakehouse, spark: SparkSession, name: str = "events") -> None:
    lh.create_table(name, SCHEMA, partition_by="day")
    lh.append(name, spark.createDataFrame(ROWS, SCHEMA).coalesce(1))


def table_rows(lh: Lakehouse, spark: SparkSession, version: int | None = None) -> list[tuple]:
    got = lh.read(spark, "events", version=version).collect()
    return sorted((r["id"], r["amount"], r["day"]) for r in got)


def paths_by_day(lh: Lakehouse) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in lh.files("events"):
        out.setdefault(str(f.partition["day"]), set()).add(f.path)
    return out


def job_folders(lh: Lakehouse) -> list[str]:
    names = (p.rsplit("/", 1)[-1] for p in filesystem.list_dirs(join(lh.warehouse, "events")))
    return sorted(n for n in names if n.startswith("_lh_job="))


def test_delete_and_update_rewrite_only_the_files_holding_matching_rows(
    lh: Lakehouse, spark: SparkSession
) -> None:
    make_table(lh, spark)
    before = paths_by_day(lh)
    assert lh.version("events") == 1

    # A data-column predicate in one partition: d1's file is rewritten without row 2.
    got = lh.delete("events", "day = 'd1' AND amount < 0", spark=spark)
    assert got == DmlResult(2, rows_deleted=1, files_added=1, files_removed=1)
    after = paths_by_day(lh)
    assert after["d2"] == before["d2"] and after["d3"] == before["d3"]  # untouched
    assert after["d1"].isdisjoint(before["d1"])

    # A partition-only predicate is decided from the catalog; expressions see the old row.
    got = lh.update("events", {"amount": "amount * 2", "id": "id + 100"}, "day = 'd2'")
    assert got == DmlResult(3, rows_updated=2, files_added=1, files_removed=1)

    # Statistics rule out every file: nothing read, nothing committed (as deltalake).
    assert lh.delete("events", "id > 1000 AND day IN ('d1', 'd3')") == DmlResult(3)
    # A file whose every row goes is removed without a replacement.
    assert lh.delete("events", "amount = 8") == DmlResult(4, rows_deleted=1, files_removed=1)

    assert table_rows(lh, spark) == [(1, 10, "d1"), (3, 7, "d1"), (104, -2, "d2"), (105, 6, "d2")]
    assert table_rows(lh, spark, version=1) == sorted(ROWS)  # time travel to before
    history = lh.history("events")
    assert [h.operation for h in history][-3:] == ["DELETE", "UPDATE", "DELETE"]
    update = history[3]
    assert len(update.added_files) == 1 and len(update.removed_files) == 1  # d1, d3 kept


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)  # checked before any call
def test_bad_statements_are_refused_before_anything_is_written(
    lh: Lakehouse, spark: SparkSession
) -> None:
    make_table(lh, spark)
    folders = job_folders(lh)
    refused = {
        "no_such_column = 1": "no_such_column",
        "amount <": "invalid predicate",
        "amount": "invalid predicate",  # not a boolean
    }
    for predicate, named in refused.items():
        with pytest.raises(ValueError, match=named):
            lh.delete("events", predicate, spark=spark)
    with pytest.raises(ValueError, match="no column 'nope'"):
        lh.update("events", {"nope": "1"}, spark=spark)
    with pytest.raises(ValueError, match="invalid update expression"):
        lh.update("events", {"amount": "missing + 1"}, spark=spark)
    assert lh.version("events") == 1
    assert job_folders(lh) == folders


def test_statements_on_disjoint_partitions_both_commit_and_overlapping_ones_conflict(
    lh: Lakehouse, spark: SparkSession
) -> None:
    make_table(lh, spark)
    d3 = spark.createDataFrame([(7, 1, "d3")], SCHEMA)
    d1 = spark.createDataFrame([(8, 9, "d1")], SCHEMA)

    # While a delete in d1 is about to commit, an update of d2 and an append to d3 land.
    def others_commit(_: str) -> None:
        assert lh.update("events", {"amount": "0"}, "day = 'd2'").version == 2
        assert lh.append("events", d3) == 3

    lh.failpoints.enable(fp.BEFORE_COMMIT, others_commit, times=1)
    assert lh.delete("events", "day = 'd1' AND amount < 0").version == 4

    # While another delete in d1 is about to commit, an append adds a row it would delete.
    lh.failpoints.enable(fp.BEFORE_COMMIT, lambda _: lh.append("events", d1), times=1)
    folders = job_folders(lh)
    with pytest.raises(ConcurrentModificationError, match="may hold rows matching"):
        lh.delete("events", "day = 'd1' AND amount > 5")
    assert lh.version("events") == 5  # the append's version; the delete committed nothing
    assert len(job_folders(lh)) == len(folders) + 1  # the append's; the delete's went
    assert table_rows(lh, spark) == [
        (1, 10, "d1"),
        (3, 7, "d1"),
        (4, 0, "d2"),
        (5, 0, "d2"),
        (6, 8, "d3"),
        (7, 1, "d3"),
        (8, 9, "d1"),
    ]
