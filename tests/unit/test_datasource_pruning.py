"""Which files a filtered ``format("percolake")`` read keeps (``pruning``), without Spark.

The rule under test: a file may be dropped only if no row of it can satisfy the
filters; partition filters are decided exactly (SQL's three-valued logic) and not
returned, every other filter goes back to Spark.
"""

from __future__ import annotations

import datetime

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_integration.engine.model import ColumnStats
from spark_integration.spark.datasource.batch_read import _PUSHDOWN_WORKER, planning_with_pushdown
from spark_integration.spark.datasource.pruning import Candidate, prune

pytestmark = pytest.mark.unit

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("score", DoubleType()),
        StructField("name", StringType()),
        StructField("day", StringType()),
        StructField("hour", IntegerType()),
        StructField("on", DateType()),
        StructField("flag", BooleanType()),
        StructField("label", StringType("UTF8_LCASE")),
    ]
)
PARTITIONS = ("day", "hour", "on", "flag", "label")


def part(
    day: str | None = "d1",
    hour: str | None = "3",
    on: str | None = "2024-01-02",
    flag: str | None = "true",
    label: str | None = "x",
    stats: dict[str, ColumnStats] | None = None,
    rows: int = 10,
) -> Candidate:
    values = {"day": day, "hour": hour, "on": on, "flag": flag, "label": label}
    return Candidate(values, rows, stats)


def kept(files: list[Candidate], *filters: Filter) -> list[int]:
    return prune(files, list(filters), SCHEMA, PARTITIONS).kept


def remaining(files: list[Candidate], *filters: Filter) -> list[Filter]:
    return prune(files, list(filters), SCHEMA, PARTITIONS).remaining


# --- partition filters: exact -------------------------------------------------------------

DAYS = [part(day="d0"), part(day="d1"), part(day="d2"), part(day=None)]


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (EqualTo(("day",), "d1"), [1]),
        (EqualNullSafe(("day",), "d1"), [1]),
        (EqualNullSafe(("day",), None), [3]),
        (Not(EqualTo(("day",), "d1")), [0, 2]),  # null <> 'd1' is null: not kept
        (GreaterThan(("day",), "d0"), [1, 2]),
        (GreaterThanOrEqual(("day",), "d1"), [1, 2]),
        (LessThan(("day",), "d1"), [0]),
        (LessThanOrEqual(("day",), "d1"), [0, 1]),
        (In(("day",), ("d0", "d2", "zz")), [0, 2]),
        (Not(In(("day",), ("d0", None))), []),  # NOT IN with a null is never true
        (IsNull(("day",)), [3]),
        (IsNotNull(("day",)), [0, 1, 2]),
        (Not(IsNull(("day",))), [0, 1, 2]),
        (StringStartsWith(("day",), "d"), [0, 1, 2]),
        (StringEndsWith(("day",), "2"), [2]),
        (StringContains(("day",), "1"), [1]),
        (EqualTo(("day",), None), []),
    ],
)
def test_partition_filters_are_decided_per_file(f: Filter, expected: list[int]) -> None:
    assert kept(DAYS, f) == expected
    assert remaining(DAYS, f) == []  # fully handled: Spark need not apply it


def test_partition_values_are_compared_as_their_column_type() -> None:
    hours = [part(hour="9"), part(hour="10"), part(hour=None)]
    # As text "9" > "10"; as the integer column it is, 9 < 10.
    assert kept(hours, GreaterThan(("hour",), 9)) == [1]
    dates = [part(on="2024-01-09"), part(on="2024-01-10")]
    assert kept(dates, LessThan(("on",), datetime.date(2024, 1, 10))) == [0]
    flags = [part(flag="true"), part(flag="false")]
    assert kept(flags, EqualTo(("flag",), True)) == [0]
    assert kept(flags, Not(EqualTo(("flag",), True))) == [1]


def test_several_filters_are_an_and() -> None:
    files = [part(day="d1", hour="1"), part(day="d1", hour="2"), part(day="d2", hour="1")]
    assert kept(files, EqualTo(("day",), "d1"), EqualTo(("hour",), 1)) == [0]


@pytest.mark.parametrize(
    ("files", "f"),
    [
        # A partition value that does not parse as its column's type: left to Spark.
        ([part(hour="3"), part(hour="x")], EqualTo(("hour",), 3)),
        ([part(flag="TRUE"), part(flag="false")], EqualTo(("flag",), True)),
        # A literal of another type than the column's (bool is an int in Python).
        ([part(hour="1"), part(hour="0")], EqualTo(("hour",), True)),
        ([part(on="2024-01-02")], EqualTo(("on",), datetime.datetime(2024, 1, 2))),
        # A collated string column compares differently: not evaluated here.
        ([part(label="X"), part(label="y")], EqualTo(("label",), "x")),
        # A nested or unknown column.
        ([part(), part(day="d2")], EqualTo(("day", "inner"), "d1")),
        ([part(), part(day="d2")], EqualTo(("nope",), "d1")),
    ],
)
def test_what_is_not_understood_prunes_nothing_and_goes_back_to_spark(
    files: list[Candidate], f: Filter
) -> None:
    pruned = prune(files, [f], SCHEMA, PARTITIONS)
    assert pruned.kept == list(range(len(files)))
    assert pruned.remaining == [f]
    assert pruned.remaining[0] is f  # Spark matches the returned filters by identity


# --- statistics: skip only what cannot match -----------------------------------------------


def stats_file(low: int | None, high: int | None, nulls: int | None, rows: int = 10) -> Candidate:
    return part(stats={"id": ColumnStats(nulls, low, high)}, rows=rows)


FILES = [stats_file(0, 9, 0), stats_file(10, 19, 2), stats_file(None, None, 10), part()]


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (EqualTo(("id",), 5), [0, 2, 3]),  # file 2 has no bounds, file 3 no statistics
        (EqualTo(("id",), 25), [2, 3]),
        (GreaterThan(("id",), 9), [1, 2, 3]),
        (GreaterThanOrEqual(("id",), 9), [0, 1, 2, 3]),
        (LessThan(("id",), 10), [0, 2, 3]),
        (LessThanOrEqual(("id",), 10), [0, 1, 2, 3]),
        (In(("id",), (15, 30)), [1, 2, 3]),
        (IsNull(("id",)), [1, 2, 3]),
        (IsNotNull(("id",)), [0, 1, 3]),  # file 2 is all nulls
        (Not(EqualTo(("id",), 5)), [0, 1, 2, 3]),  # not understood on statistics
    ],
)
def test_statistics_skip_files_no_row_of_which_matches(f: Filter, expected: list[int]) -> None:
    pruned = prune(FILES, [f], SCHEMA, PARTITIONS)
    assert pruned.kept == expected
    assert pruned.remaining == [f]  # Spark still filters the rows of the kept files


def test_string_and_date_statistics() -> None:
    names = [
        part(stats={"name": ColumnStats(0, "apple", "kiwi")}),
        part(stats={"name": ColumnStats(0, "lemon", "pear")}),
    ]
    assert kept(names, EqualTo(("name",), "mango")) == [1]
    assert kept(names, LessThan(("name",), "banana")) == [0]


def test_float_statistics_are_never_trusted() -> None:
    # Bounds of a float column would miss NaN (greater than everything in Spark).
    files = [part(stats={"score": ColumnStats(0, 1, 2)})]
    assert kept(files, GreaterThan(("score",), 5.0)) == [0]


# --- when the reader with pushFilters is handed out ----------------------------------------


def test_the_pushdown_reader_goes_only_to_sparks_pushdown_worker() -> None:
    assert not planning_with_pushdown()
    worker_globals = {"__name__": _PUSHDOWN_WORKER, "ask": planning_with_pushdown}
    assert eval("ask()", worker_globals) is True
    other = {"__name__": "pyspark.sql.worker.plan_data_source_read", "ask": planning_with_pushdown}
    assert eval("ask()", other) is False
