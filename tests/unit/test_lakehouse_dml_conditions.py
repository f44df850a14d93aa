"""Which parts of a DML predicate become engine conditions (``spark.dml.conditions_of``).

A condition prunes files and widens nothing, so only a conjunct that is wholly one
of the simple forms, with a literal of the column's own kind, may become one; the
rest is left out. No Spark session: the predicate text and the schema suffice.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import DateType, DoubleType, LongType, StringType, StructField, StructType

from spark_integration.engine.read_set import IN, IS_NULL, Condition
from spark_integration.spark.dml import conditions_of

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("score", DoubleType()),
        StructField("day", StringType()),
        StructField("at", DateType()),
    ]
)


def conditions(predicate: str) -> tuple[tuple[Condition, ...], bool]:
    return conditions_of(predicate, SCHEMA, ("day",))


def test_simple_conjuncts_become_conditions_and_decide_partition_predicates_exactly() -> None:
    day = Condition("day", "=", "str", ("d1",))
    assert conditions("day = 'd1'") == ((day,), True)
    assert conditions("(`DAY` == 'd1') and ID >= -3") == (
        (day, Condition("id", ">=", "int", (-3,))),
        False,
    )
    assert conditions("day IN ('a', 'b') AND at < DATE '2024-02-01' AND id IS NULL") == (
        (
            Condition("day", IN, "str", ("a", "b")),
            Condition("at", "<", "date", ("2024-02-01",)),
            Condition("id", IS_NULL, "int"),
        ),
        False,
    )


@pytest.mark.parametrize(
    "predicate",
    [
        "day = 'd1' OR id = 2",  # a top-level OR: no conjunction at all
        "id BETWEEN 1 AND 5",  # its AND is not a conjunction
        "day = 'd1' -- AND id = 2",  # a comment could hide an AND
        "day = 'it\\'s'",  # an escape: the string's end is not certain here
        "score > 1",  # a double: statistics keep no bounds for it
        "id = '5'",  # a literal of another kind: Spark would cast it
        "NOT day = 'd1'",
        "id + 1 = 5",
        "'d1' = day",
    ],
)
def test_what_is_not_certain_becomes_no_condition(predicate: str) -> None:
    assert conditions(predicate) == ((), False)


def test_a_conjunct_not_understood_is_left_out_and_the_rest_kept() -> None:
    assert conditions("day = 'd1' AND upper(day) = 'D1'") == (
        (Condition("day", "=", "str", ("d1",)),),
        False,
    )
