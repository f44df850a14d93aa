"""MERGE's Arrow path (``spark.merge_arrow``) against its Spark path, statement by statement.

Each case builds the same table twice in one lakehouse, runs the same MERGE on one
copy in Arrow and on the other in Spark (``spark.testing.merge_paths``), and asserts
that each ran the path it was meant to and that they agree: the table's rows, the
``DmlResult`` counts (every one but ``files_added``: Spark packs small files into one
task's output, Arrow rewrites file by file), the change feed of the version, and for a
refused statement the error, with nothing committed and no job folder left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_integration import DmlResult, Lakehouse
from spark_integration.engine.locations import join
from spark_integration.spark import filesystem
from spark_integration.spark.merge import MergeBuilder
from spark_integration.spark.testing import merge_paths

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("amount", LongType()),
        StructField("day", StringType()),
        StructField("x", DoubleType()),
    ]
)
#: Three files (one per append), ids 1-9, one NULL id.
FILES = [
    [(1, 10, "d1", 0.5), (2, -5, "d1", 1.5), (3, 7, "d2", None)],
    [(4, -1, "d2", 2.0), (5, 3, "d3", 0.0), (None, 0, "d1", 9.0)],
    [(6, 8, "d3", 1.0), (7, 1, "d1", 3.5), (8, 2, "d2", 4.5), (9, 9, "d3", 5.5)],
]
ON = "target.id = source.id"
Clauses = Callable[[MergeBuilder], MergeBuilder]


@dataclass(frozen=True)
class Case:
    source: list[tuple[Any, ...]]
    clauses: Clauses
    predicate: str = ON
    partition_by: str | None = None
    source_schema: StructType = SCHEMA
    #: The path the Arrow run must take ("spark": the statement is not Arrow's).
    path: str = "arrow"
    files: Sequence[Sequence[tuple[Any, ...]]] = field(default_factory=lambda: FILES)


def _upsert(b: MergeBuilder) -> MergeBuilder:
    return b.when_matched_update_all().when_not_matched_insert_all()


CASES = {
    "update_all_insert_all": Case(
        [(2, 20, "d1", 2.5), (6, 60, "d3", 6.5), (30, 3, "d9", 0.1)], _upsert
    ),
    "null_keys_never_match": Case(
        [(None, 99, "d1", 0.0), (3, 33, "d2", None), (None, 98, "d2", 1.0)], _upsert
    ),
    "no_row_matches": Case([(100, 1, "d1", 1.0), (101, 2, "d2", 2.0)], _upsert),
    "no_row_matches_nothing_to_insert": Case(
        [(100, 1, "d1", 1.0)], lambda b: b.when_matched_update_all()
    ),
    "delete_and_insert": Case(
        # Every row of the second file but the NULL one goes: 4 and 5; 1 too.
        [(4, 0, "d2", 0.0), (5, 0, "d3", 0.0), (1, 0, "d1", 0.0), (50, 5, "d1", 0.0)],
        lambda b: b.when_matched_delete().when_not_matched_insert_all(),
    ),
    "delete_emptying_a_file": Case(
        [(1, 0, "d1", 0.0), (2, 0, "d1", 0.0), (3, 0, "d2", 0.0)],
        lambda b: b.when_matched_delete(),
    ),
    "update_some_columns_from_both_sides": Case(
        [(1, 11, "d1", 9.9), (7, 77, "d1", 9.9), (60, 6, "d6", 6.0)],
        lambda b: b.when_matched_update(
            {"amount": "source.amount", "x": "target.x"}
        ).when_not_matched_insert({"id": "source.id", "day": "day"}),
    ),
    "insert_only_with_duplicate_matching_keys": Case(
        [(1, 0, "d1", 0.0), (1, 1, "d1", 0.0), (70, 7, "d7", 0.0), (70, 8, "d7", 0.0)],
        lambda b: b.when_not_matched_insert_all(),
    ),
    "unconditional_delete_with_duplicate_keys": Case(
        [(8, 0, "d2", 0.0), (8, 1, "d2", 0.0)], lambda b: b.when_matched_delete()
    ),
    "partitioned_pruned_by_source_and_literal": Case(
        [(1, 100, "d1", 0.0), (4, 400, "d2", 0.0), (7, 700, "d1", 0.0), (90, 9, "d1", 0.0)],
        _upsert,
        predicate=f"{ON} AND target.day = source.day AND target.day = 'd1'",
        partition_by="day",
    ),
    "partitioned_key_on_partition_column": Case(
        # (4, d2) joins; (4, d3) does not (another partition): inserted.
        [(4, 40, "d2", 0.0), (4, 41, "d3", 0.0)],
        _upsert,
        predicate="source.day = target.day AND source.id = target.id",
        partition_by="day",
    ),
    "partitioned_one_key_moves_rows": Case(
        # One key, not a partition column: one pass; (4) moves from d2 to d3.
        [(4, 40, "d3", 0.0), (7, 70, "d1", 0.0), (60, 6, "d6", 0.0)],
        _upsert,
        partition_by="day",
    ),
    "string_key_joins_many_target_rows": Case(
        # Each source day joins the target rows of that day, in every file.
        [(0, 99, "d2", 9.0), (0, 98, "d7", 8.0)],
        lambda b: b.when_matched_update({"amount": "source.amount"}).when_not_matched_insert_all(),
        predicate="target.day = source.day",
    ),
    "widening_int_and_float_source": Case(
        [(2, 22, "d1", 0.25), (80, 8, "d8", 0.5)],
        _upsert,
        source_schema=StructType(
            [
                StructField("id", IntegerType()),
                StructField("amount", IntegerType()),
                StructField("day", StringType()),
                StructField("x", FloatType()),
            ]
        ),
    ),
    "clause_predicate_is_the_spark_paths": Case(
        [(2, 20, "d1", 0.0), (30, 3, "d9", 0.0)],
        lambda b: b.when_matched_update_all("source.amount > 10").when_not_matched_insert_all(),
        path="spark",
    ),
}


def _table(lh: Lakehouse, spark: SparkSession, name: str, case: Case) -> int:
    lh.create_table(name, SCHEMA, partition_by=case.partition_by or ())
    version = 0
    for rows in case.files:
        version = lh.append(name, spark.createDataFrame(list(rows), SCHEMA).coalesce(1))
    return version


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _feed(lh: Lakehouse, spark: SparkSession, name: str, version: int) -> list[tuple[Any, ...]]:
    df = lh.changes(spark, name, version, version).drop("_commit_timestamp")
    return _rows(df)


def _jobs(lh: Lakehouse, name: str) -> list[str]:
    found = (p.rsplit("/", 1)[-1] for p in filesystem.list_dirs(join(lh.warehouse, name)))
    return sorted(n for n in found if n.startswith("_lh_job="))


@dataclass
class Outcome:
    result: DmlResult | None
    error: str | None
    rows: list[tuple[Any, ...]]
    feed: list[tuple[Any, ...]]
    paths: list[str]
    read: int  # the version the statement read


def _run(lh: Lakehouse, spark: SparkSession, name: str, case: Case, *, spark_only: bool) -> Outcome:
    read = _table(lh, spark, name, case)
    source = spark.createDataFrame(case.source, case.source_schema)
    jobs = _jobs(lh, name)
    result, error = None, None
    with merge_paths(spark_only=spark_only) as paths:
        try:
            result = case.clauses(lh.merge(name, source, case.predicate)).execute()
        except ValueError as e:
            error = str(e).replace(repr(name), "<table>")
    version = lh.version(name)
    if result is None or result.version == read:
        assert version == read and _jobs(lh, name) == jobs  # nothing committed or left
    feed = _feed(lh, spark, name, version) if version > read else []
    return Outcome(result, error, _rows(lh.read(spark, name)), feed, list(paths), read)


def _counts(result: DmlResult | None) -> tuple[int, ...] | None:
    if result is None:
        return None
    return (
        result.version,
        result.rows_inserted,
        result.rows_updated,
        result.rows_deleted,
        result.files_removed,
    )


def _agree(lh: Lakehouse, spark: SparkSession, case: Case) -> Outcome:
    arrow = _run(lh, spark, "by_arrow", case, spark_only=False)
    by_spark = _run(lh, spark, "by_spark", case, spark_only=True)
    assert arrow.paths == [case.path] and by_spark.paths == ["spark"]
    assert arrow.error == by_spark.error
    assert _counts(arrow.result) == _counts(by_spark.result)
    assert arrow.rows == by_spark.rows
    assert arrow.feed == by_spark.feed
    if arrow.result is not None and arrow.result.version > arrow.read:
        # files_added: the files the version added (Spark may pack them differently).
        version = arrow.result.version
        added = {f.path for f in lh.files("by_arrow", version)} - {
            f.path for f in lh.files("by_arrow", version - 1)
        }
        assert arrow.result.files_added == len(added)
    return arrow


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_merge_in_arrow_gives_what_spark_gives(
    lh: Lakehouse, spark: SparkSession, case: str
) -> None:
    got = _agree(lh, spark, CASES[case])
    assert got.error is None and got.result is not None
    assert got.rows  # the tables are never empty: the comparison compares rows


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)
def test_duplicate_source_keys_fail_alike_and_commit_nothing(
    lh: Lakehouse, spark: SparkSession
) -> None:
    case = Case([(4, 1, "d2", 0.0), (4, 2, "d2", 0.0), (5, 5, "d3", 0.0)], _upsert)
    got = _agree(lh, spark, case)
    assert got.result is None and got.error is not None
    assert "a target row matched 2 source rows" in got.error
    assert 'The target row: {"id":4,' in got.error


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)
def test_one_pass_reads_each_footer_once_and_only_joined_files_whole(
    lh: Lakehouse, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MERGE of unique source keys opens each candidate file once (one footer read,
    never ``read_metadata`` again), reads its key column, and reads the other columns of
    the files a source row joined only."""
    case = CASES["update_all_insert_all"]  # ids 2 and 6: the first and third files
    _table(lh, spark, "t", case)
    opened: list[int] = []
    columns_read: list[tuple[str, ...]] = []
    real_file, real_metadata = pq.ParquetFile, pq.read_metadata

    class Counting(real_file):  # type: ignore[misc, valid-type]
        def __init__(self, source: Any, *args: Any, **kwargs: Any) -> None:
            opened.append(1)
            super().__init__(source, *args, **kwargs)

        def read(self, columns: Any = None, **kwargs: Any) -> Any:
            columns_read.append(tuple(columns or ()))
            return super().read(columns, **kwargs)

    def no_metadata(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a footer read again")

    monkeypatch.setattr(pq, "ParquetFile", Counting)
    monkeypatch.setattr(pq, "read_metadata", no_metadata)
    source = spark.createDataFrame(case.source, SCHEMA)
    with merge_paths(spark_only=False) as paths:
        result = case.clauses(lh.merge("t", source, ON)).execute()
    monkeypatch.setattr(pq, "ParquetFile", real_file)
    monkeypatch.setattr(pq, "read_metadata", real_metadata)
    assert paths == ["arrow"]
    assert (result.rows_updated, result.rows_inserted, result.files_removed) == (2, 1, 2)
    # Three candidate files (the source's ids span them all), each opened once.
    assert len(opened) == 3
    assert sorted(columns_read) == sorted([("id",)] * 3 + [("amount", "day", "x")] * 2)


@pytest.mark.parametrize("lh", ["remote"], indirect=True)
def test_merge_in_arrow_through_a_gateway(lh: Lakehouse, spark: SparkSession) -> None:
    got = _agree(lh, spark, CASES["update_all_insert_all"])
    assert got.result is not None
    assert (got.result.rows_updated, got.result.rows_inserted) == (2, 1)


@pytest.mark.s3
def test_merge_in_arrow_on_s3(spark: SparkSession, s3_warehouse: str, tmp_path: Any) -> None:
    from txn import TransactionManager

    manager = TransactionManager.embedded(f"sqlite:///{tmp_path}/store.db")
    try:
        lh = Lakehouse(manager, s3_warehouse)
        case = CASES["partitioned_pruned_by_source_and_literal"]
        got = _agree(lh, spark, case)
        assert got.result is not None and got.result.rows_updated == 2
        assert all(f.path.startswith("s3://") for f in lh.files("by_arrow"))
        # Unpartitioned, one key: the one pass, each file written by write_table.
        lh = Lakehouse(manager, f"{s3_warehouse}/one_pass", catalog="one_pass")
        got = _agree(lh, spark, CASES["update_all_insert_all"])
        assert got.result is not None and got.result.rows_updated == 2
    finally:
        manager.close()
