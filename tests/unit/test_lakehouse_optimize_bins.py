"""How compaction plans its work (``spark.optimize``), without a Spark session.

``plan_bins`` decides which files are rewritten together: per partition, small
files packed first-fit decreasing up to the target, bins of one file left out.
``target_bytes`` and ``partition_conditions`` are the checks made before anything
is written.
"""

from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration.engine.model import FileEntry
from spark_integration.engine.read_set import Condition
from spark_integration.spark.optimize import MB, partition_conditions, plan_bins, target_bytes

pytestmark = pytest.mark.unit

SCHEMA = StructType(
    [StructField("id", LongType()), StructField("day", StringType())],
)


def f(path: str, size: int, day: str | None = "d1") -> FileEntry:
    return FileEntry(path, size, 1, {"day": day})


def paths(bins: list[tuple[FileEntry, ...]]) -> list[list[str]]:
    return [[e.path for e in b] for b in bins]


def test_files_are_packed_first_fit_decreasing_up_to_the_target() -> None:
    files = [f("a", 50), f("b", 60), f("c", 30), f("d", 40), f("e", 20)]
    # Largest first: b(60) opens a bin, a(50) opens another, d(40) joins b (100),
    # c(30) joins a (80), e(20) joins a (100).
    assert paths(plan_bins(files, 100)) == [["b", "d"], ["a", "c", "e"]]
    # A bin may be filled exactly, never past the target.
    assert paths(plan_bins([f("x", 50), f("y", 50), f("z", 1)], 100)) == [["x", "y"]]


def test_partitions_never_share_a_bin_and_large_or_lone_files_stay() -> None:
    files = [
        f("big", 100),  # at the target: already large
        f("d1-a", 10),
        f("d2-a", 10, "d2"),
        f("d1-b", 10),
        f("null-a", 5, None),
        f("null-b", 5, None),
        f("d3-alone", 10, "d3"),  # the only small file of its partition
    ]
    assert paths(plan_bins(files, 100)) == [["d1-a", "d1-b"], ["null-a", "null-b"]]
    # Files too large to pair: every bin would hold one file, so nothing to do.
    assert plan_bins([f("a", 60), f("b", 60), f("c", 60)], 100) == []
    assert plan_bins([], 100) == []


def test_a_plan_is_the_same_whatever_order_the_files_are_listed_in() -> None:
    files = [f(f"p{i}", 10 + i % 3) for i in range(12)]
    assert paths(plan_bins(files, 40)) == paths(plan_bins(list(reversed(files)), 40))
    planned = plan_bins(files, 40)
    assert all(sum(e.size_bytes for e in b) <= 40 for b in planned)
    assert sorted(e.path for b in planned for e in b) == sorted(e.path for e in files)


def test_the_target_must_be_a_positive_number_of_mb() -> None:
    assert target_bytes(128) == 128 * MB
    assert target_bytes(0.5) == MB // 2
    assert target_bytes(1e-9) == 1  # never a target of 0 bytes
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="must be positive"):
            target_bytes(bad)
    for wrong in ("128", True, None, [128]):
        with pytest.raises(TypeError, match="must be a number"):
            target_bytes(wrong)


def test_a_predicate_may_select_partitions_only() -> None:
    what = "optimize of table 'events'"
    assert partition_conditions(None, SCHEMA, ("day",), what) == ()
    assert partition_conditions("day = 'd1'", SCHEMA, ("day",), what) == (
        Condition("day", "=", "str", ("d1",)),
    )
    both = partition_conditions("day IN ('d1', 'd2') AND day IS NOT NULL", SCHEMA, ("day",), what)
    assert [c.op for c in both] == ["in", "not_null"]
    for predicate in ("id = 1", "day = 'd1' AND id > 3", "day = 'd1' OR day = 'd2'"):
        with pytest.raises(ValueError, match="partition columns"):
            partition_conditions(predicate, SCHEMA, ("day",), what)
    with pytest.raises(ValueError, match="no partition columns"):
        partition_conditions("id = 1", SCHEMA, (), what)
