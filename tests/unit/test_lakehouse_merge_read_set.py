"""The pure parts of MERGE and overwrite by predicate, without Spark jobs.

Which target rows a MERGE reads (``spark.merge``: target-only conjuncts, partitions
equated with a source column), how the kinds of rows it reads widen into one read
set (``read_set.widen``), the files it kept but depends on (``ReadSet.reads``), and
the read set of a dynamic partition overwrite (``spark.replace``).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType

from spark_integration.engine import Catalog, ConcurrentModificationError
from spark_integration.engine.model import APPEND, MERGE, ColumnStats, FileEntry, TableMeta
from spark_integration.engine.read_set import IN, Condition, ReadSet, check_read_set, widen
from spark_integration.service.convert import read_set_from_pb, read_set_to_pb
from spark_integration.spark.merge import partition_literal, partition_pairs, target_conditions
from spark_integration.spark.replace import partitions_read_set
from txn import TransactionConfig, TransactionManager

pytestmark = pytest.mark.unit

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("amount", LongType()),
        StructField("day", StringType()),
        StructField("on", DateType()),
    ]
)


def day(*days: str) -> Condition:
    return (
        Condition("day", IN, "str", days) if len(days) > 1 else Condition("day", "=", "str", days)
    )


def entry(path: str, d: str | None) -> FileEntry:
    return FileEntry(path, 100, 10, {"day": d}, {"amount": ColumnStats(0, 0, 9)})


def test_target_conditions_take_target_only_conjuncts_and_partition_pairs_the_equated_columns() -> (
    None
):
    predicate = "target.id = source.id AND target.day = 'd1' AND `target`.amount > 5 AND id < 3"
    # ``id`` unqualified is the source's too (Spark would call it ambiguous): left out.
    got = target_conditions(predicate, SCHEMA, "target", ["id", "amount", "day"])
    assert got == [day("d1"), Condition("amount", ">", "int", (5,))]
    # Unqualified and only the target's: taken.
    assert target_conditions("amount >= 2", SCHEMA, "t", ["id"]) == [
        Condition("amount", ">=", "int", (2,))
    ]
    # A source-side or mixed conjunct, an OR, a comment: nothing decided.
    assert target_conditions("source.day = 'd1'", SCHEMA, "target", ["day"]) == []
    assert target_conditions("target.day = 'd1' OR target.day = 'd2'", SCHEMA, "target", []) == []
    assert target_conditions("target.day = 'd1' -- x", SCHEMA, "target", []) == []
    pairs = "t.id = s.id AND s.d = t.day AND t.amount = s.amount"
    assert partition_pairs(pairs, ("day",), "t", "s", ["id", "d", "amount"]) == {"day": "d"}
    assert partition_pairs("t.day <=> s.d", ("day",), "t", "s", ["d"]) == {}  # null-safe: no
    assert partition_pairs("t.day = s.d OR t.id = s.id", ("day",), "t", "s", ["d"]) == {}
    assert partition_literal("d1", "str") == "d1"
    assert partition_literal(datetime.date(2024, 1, 2), "date") == "2024-01-02"
    assert partition_literal(True, "int") is None  # a bool is no int here
    assert partition_literal(3, "str") is None  # Spark would cast: not decided


def test_widen_keeps_what_every_alternative_implies() -> None:
    amount = Condition("amount", ">", "int", (5,))
    # Matched rows in d1/d2 with amount > 5, by-source rows in d3: day in d1, d2, d3.
    assert widen([(day("d1", "d2"), amount), (day("d3"),)]) == (day("d1", "d2", "d3"),)
    assert widen([(day("d1"), amount), (amount, day("d1"))]) == (day("d1"), amount)
    assert widen([(day("d1"),), ()]) == ()  # one alternative reads every row
    assert widen([]) == ()
    merged = widen([(day("d1"),), (day("d1"),), (day("d2"),)])
    f1, f4 = entry("a", "d1"), entry("b", "d4")
    assert ReadSet(0, (), merged).may_match(f1) and not ReadSet(0, (), merged).may_match(f4)


@pytest.fixture
def catalog() -> Iterator[Catalog]:
    tm = TransactionManager.embedded("memory://", config=TransactionConfig(settle_backoff_ms=1))
    catalog = Catalog(tm, "lakehouse")
    catalog.create(TableMeta("t", "{}", ("day",), "/nowhere/t", 0), job_id="create")
    yield catalog
    tm.close()


def commit(catalog: Catalog, operation: str, files: list[FileEntry], rs: ReadSet | None) -> int:
    job = f"{operation}-{uuid.uuid4().hex}"
    return catalog.commit_files(
        "t", operation, files, job_id=job, job_started_ms=0, read_set=rs
    ).version


def test_a_merge_depends_on_the_files_holding_rows_that_joined_even_when_it_keeps_them(
    catalog: Catalog,
) -> None:
    assert commit(catalog, APPEND, [entry("d1-a", "d1"), entry("d2-a", "d2")], None) == 1
    # An insert-only MERGE read d1-a (a source row joined one of its rows) and keeps it.
    insert = ReadSet(1, (), (day("d1"),), reads=("d1-a",))
    assert commit(catalog, MERGE, [entry("d1-new", "d1")], insert) == 2
    live = {e.path for e in catalog.files("t", None, FileEntry)[2]}
    assert live == {"d1-a", "d2-a", "d1-new"}  # kept, not removed
    # Another statement rewrote d1-a since version 2: a MERGE that depends on it loses.
    assert commit(catalog, MERGE, [entry("d1-b", "d1")], ReadSet(2, ("d1-a",), (day("d1"),))) == 3
    with pytest.raises(ConcurrentModificationError, match="d1-a"):
        commit(catalog, MERGE, [entry("d1-c", "d1")], ReadSet(2, (), (day("d1"),), ("d1-a",)))
    # A file in another partition changing does not concern it.
    assert commit(catalog, MERGE, [], ReadSet(3, ("d2-a",), (day("d2"),))) == 4
    assert (
        commit(catalog, MERGE, [entry("d1-d", "d1")], ReadSet(3, (), (day("d1"),), ("d1-b",))) == 5
    )
    with pytest.raises(ValueError, match="as removed and as kept"):
        check_read_set(ReadSet(0, ("a",), (), ("a",)))
    rs = ReadSet(7, ("x",), (day("d1", "d2"),), ("y", "z"))
    assert read_set_from_pb(read_set_to_pb(rs)) == rs  # type: ignore[arg-type]


def test_a_dynamic_overwrite_reads_and_replaces_only_the_partitions_it_wrote() -> None:
    snapshot = [entry("a", "d1"), entry("b", "d2"), entry("c", None), entry("d", "d1")]
    written = [entry("n1", "d1"), entry("n3", "d3")]
    rs = partitions_read_set(4, snapshot, written, SCHEMA, ("day",))
    assert rs == ReadSet(4, ("a", "d"), (day("d1", "d3"),))
    assert not rs.may_match(entry("x", "d2")) and rs.may_match(entry("y", "d3"))
    # A NULL partition cannot be an IN value: the column is left out (every file may match).
    nulls = partitions_read_set(4, snapshot, [entry("n", None)], SCHEMA, ("day",))
    assert nulls == ReadSet(4, ("c",), ())
    assert partitions_read_set(4, snapshot, [], SCHEMA, ("day",)) == ReadSet(4, (), ())


def test_the_data_source_options_of_an_overwrite_by_predicate_are_checked() -> None:
    from spark_integration.spark.datasource.batch_write import replace_mode
    from spark_integration.spark.datasource.options import write_options

    where = write_options({"path": "t", "replaceWhere": "day = 'd1'"})
    assert where.replace_where == "day = 'd1'" and replace_mode(where, True) == "where"
    dynamic = write_options({"path": "t", "partitionOverwriteMode": "Dynamic"})
    assert replace_mode(dynamic, True) == "dynamic" and replace_mode(dynamic, False) is None
    with pytest.raises(ValueError, match='needs mode\\("overwrite"\\)'):
        replace_mode(where, False)
    with pytest.raises(ValueError, match="not both"):
        write_options({"path": "t", "replaceWhere": "x", "partitionOverwriteMode": "dynamic"})
    with pytest.raises(ValueError, match="replaceWhere is empty"):
        write_options({"path": "t", "replaceWhere": " "})
    idempotent = write_options(
        {"path": "t", "replaceWhere": "day = 'd1'", "txnAppId": "a", "txnVersion": "1"}
    )
    with pytest.raises(ValueError, match="txnAppId"):
        replace_mode(idempotent, True)
