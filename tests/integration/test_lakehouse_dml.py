"""DELETE and UPDATE on lakehouse tables, end to end: a real local Spark session, an
embedded manager and a real gateway process (``percolake serve``), a local warehouse.

Each table is partitioned by ``day`` with one file per day, so the tests can say
exactly which files a statement must leave alone. Concurrent statements are staged
with the ``before_commit`` fail point: the first statement has read and written its
files when the second one commits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from spark_integration import ConcurrentModificationError, DmlResult, Lakehouse
from spark_integration.engine import lakehouse_failpoints as fp
from tests.integration.lakehouse_tables import ROWS, SCHEMA, job_folders, make_table, table_rows
from txn import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def paths_by_day(lh: Lakehouse) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in lh.files("events"):
        out.setdefault(str(f.partition["day"]), set()).add(f.path)
    return out


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


# --- MERGE ------------------------------------------------------------------------------


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)  # the gateway: the next test
def test_merge_applies_clauses_in_order_in_one_commit_and_refuses_ambiguous_matches(
    lh: Lakehouse, spark: SparkSession
) -> None:
    make_table(lh, spark)
    before = paths_by_day(lh)
    source = spark.createDataFrame(
        [(1, 100, "d1"), (2, 0, "d1"), (9, 9, "d1"), (10, 1, "d2"), (5, 30, "d2")], SCHEMA
    )
    got = (
        lh.merge("events", source, "target.id = source.id AND target.day = source.day")
        .when_matched_delete("source.amount = 0")  # first match wins: 2 goes
        .when_matched_update_all("source.amount > 50")  # 1 takes the source row
        .when_matched_update({"amount": "target.amount + source.amount"})  # 5: 3 + 30
        .when_not_matched_insert_all("source.day = 'd1'")  # 9 in; 10 (d2) not
        .when_not_matched_by_source_delete("target.day = 'd1' AND target.amount = 7")  # 3
        .execute()
    )
    assert (got.version, got.rows_inserted, got.rows_updated, got.rows_deleted) == (2, 1, 2, 2)
    assert got.files_removed == 2  # d1's and d2's; d3 holds no row it changes
    assert paths_by_day(lh)["d3"] == before["d3"]
    assert table_rows(lh, spark) == [
        (1, 100, "d1"),
        (4, -1, "d2"),
        (5, 33, "d2"),
        (6, 8, "d3"),
        (9, 9, "d1"),
    ]
    assert lh.history("events")[-1].operation == "MERGE"

    # Two source rows would update target row 4: Delta's error, naming the row; nothing
    # committed, no job folder left.
    folders = job_folders(lh)
    twice = spark.createDataFrame([(4, 1, "d2"), (4, 2, "d2")], SCHEMA)
    with pytest.raises(ValueError, match=r'matched 2 source rows.* target row: \{"id":4,'):
        lh.merge("events", twice, "target.id = source.id").when_matched_update_all().execute()
    assert lh.version("events") == 2 and job_folders(lh) == folders
    with pytest.raises(ValueError, match="invalid merge predicate"):
        lh.merge("events", twice, "target.nope = source.id").when_matched_delete().execute()


@pytest.mark.parametrize("lh", ["remote"], indirect=True)
def test_merges_on_disjoint_partitions_both_commit_and_one_loses_to_a_change_of_rows_it_joined(
    lh: Lakehouse, spark: SparkSession, tmp_path: Path
) -> None:
    """Two clients of one gateway, each with its own connection (as two processes have):
    the first MERGE has read and written its files when the second commits."""
    make_table(lh, spark)
    other = Lakehouse(TransactionManager.remote(lh._tm.address), lh.warehouse, catalog=lh.catalog)  # type: ignore[attr-defined]
    keyed = "target.id = source.id AND target.day = source.day"
    d1 = spark.createDataFrame([(1, 11, "d1")], SCHEMA)
    d2 = spark.createDataFrame([(4, 44, "d2"), (7, 77, "d2")], SCHEMA)

    def other_merges_d2(_: str) -> None:
        builder = other.merge("events", d2, keyed).when_matched_update_all()
        got = builder.when_not_matched_insert_all().execute()
        assert (got.version, got.rows_inserted, got.rows_updated, got.files_removed) == (2, 1, 1, 1)

    lh.failpoints.enable(fp.BEFORE_COMMIT, other_merges_d2, times=1)
    # Pruned by a literal this time (the other by the source's partition values).
    on_d1 = "target.id = source.id AND target.day = 'd1'"
    assert lh.merge("events", d1, on_d1).when_matched_update_all().execute().version == 3

    # An insert-only MERGE keeps the d1 file whose row 3 blocks the insert of source row
    # 3, but depends on it: a DELETE of row 3 lands first, so the MERGE must not commit.
    dedupe = spark.createDataFrame([(3, 0, "d1"), (8, 8, "d1")], SCHEMA)
    lh.failpoints.enable(fp.BEFORE_COMMIT, lambda _: other.delete("events", "id = 3"), times=1)
    with pytest.raises(ConcurrentModificationError, match="rewritten or removed"):
        lh.merge("events", dedupe, on_d1).when_not_matched_insert_all().execute()
    assert lh.version("events") == 4  # the delete's
    assert table_rows(lh, spark) == [
        (1, 11, "d1"),
        (2, -5, "d1"),
        (4, 44, "d2"),
        (5, 3, "d2"),
        (6, 8, "d3"),
        (7, 77, "d2"),
    ]
    other._tm.close()  # type: ignore[attr-defined]


# --- overwrite by predicate -------------------------------------------------------------

OVERWRITE_MODE_CONF = "spark.sql.sources.partitionOverwriteMode"


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)  # the commit path is DELETE's
def test_overwrite_by_predicate_and_of_dynamic_partitions_replaces_only_their_rows(
    lh: Lakehouse, spark: SparkSession
) -> None:
    make_table(lh, spark)
    before = paths_by_day(lh)
    d3 = spark.createDataFrame([(7, 1, "d3")], SCHEMA)

    # replaceWhere on a partition, while an append to another partition lands: both commit.
    lh.failpoints.enable(fp.BEFORE_COMMIT, lambda _: lh.append("events", d3), times=1)
    new_d1 = spark.createDataFrame([(11, 1, "d1")], SCHEMA)
    assert lh.overwrite("events", new_d1, replace_where="day = 'd1'") == 3
    assert paths_by_day(lh)["d2"] == before["d2"]

    # A row outside the predicate is refused before anything is written (Delta's check).
    folders = job_folders(lh)
    outside = spark.createDataFrame([(12, 1, "d2")], SCHEMA)
    with pytest.raises(ValueError, match=r"do not satisfy the predicate, such as \{'id': 12"):
        lh.overwrite("events", outside, replace_where="day = 'd1'")
    assert lh.version("events") == 3 and job_folders(lh) == folders

    # A data-column predicate: d2's file is rewritten with its row that does not match.
    negative = spark.createDataFrame([(14, -9, "d2")], SCHEMA)
    assert lh.overwrite("events", negative, replace_where="amount < 0") == 4
    assert sum(f.record_count for f in lh.files("events") if f.partition["day"] == "d2") == 2

    # Dynamic partition overwrite asked by the session's setting. Before, lh.overwrite
    # ignored it and replaced the whole table: d1 and d3 were gone.
    spark.conf.set(OVERWRITE_MODE_CONF, "dynamic")
    try:
        dynamic = spark.createDataFrame([(20, 2, "d2"), (21, 2, "d4")], SCHEMA)
        assert lh.overwrite("events", dynamic) == 5
        # A multi-table transaction replaces whole tables only: refused, nothing written.
        with (
            pytest.raises(ValueError, match="partitionOverwriteMode=dynamic"),
            lh.transaction() as t,
        ):
            t.overwrite("events", dynamic)
    finally:
        spark.conf.unset(OVERWRITE_MODE_CONF)
    assert table_rows(lh, spark) == [
        (6, 8, "d3"),
        (7, 1, "d3"),
        (11, 1, "d1"),
        (20, 2, "d2"),
        (21, 2, "d4"),
    ]
    assert [h.operation for h in lh.history("events")][-4:] == [
        "WRITE",
        "REPLACE WHERE",
        "REPLACE WHERE",
        "REPLACE WHERE",
    ]
