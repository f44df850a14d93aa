"""The conflict rules of row-level statements (``engine.read_set``), without Spark.

A statement's commit carries what it read: the version, the files it rewrote and the
predicate's conditions. It commits only if those files are still live and no file
added since may match the conditions. The catalog here is the embedded one, on an
in-memory store; the files are metadata only (the catalog never opens them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from spark_integration.engine import Catalog, ConcurrentModificationError
from spark_integration.engine.model import APPEND, DELETE, UPDATE, ColumnStats, FileEntry, TableMeta
from spark_integration.engine.read_set import IN, IS_NULL, NOT_NULL, Condition, ReadSet
from txn import TransactionConfig, TransactionManager

TABLE = "events"


def entry(path: str, day: str | None, low: int, high: int, nulls: int = 0) -> FileEntry:
    return FileEntry(path, 100, 10, {"day": day}, {"amount": ColumnStats(nulls, low, high)})


def day_is(day: str) -> Condition:
    return Condition("day", "=", "str", (day,))


@pytest.fixture
def catalog() -> Iterator[Catalog]:
    tm = TransactionManager.embedded("memory://", config=TransactionConfig(settle_backoff_ms=1))
    catalog = Catalog(tm, "lakehouse")
    catalog.create(TableMeta(TABLE, "{}", ("day",), "/nowhere/events", 0), job_id="create")
    yield catalog
    tm.close()


def append(catalog: Catalog, *files: FileEntry) -> int:
    return catalog.commit_files(
        TABLE, APPEND, files, job_id=f"append-{files[0].path}", job_started_ms=0
    ).version


def dml(catalog: Catalog, read_set: ReadSet, *written: FileEntry) -> int:
    return catalog.commit_files(
        TABLE,
        DELETE,
        written,
        job_id=f"dml-{uuid.uuid4().hex}",  # a job id committed before returns its version
        job_started_ms=0,
        read_set=read_set,
    ).version


def live(catalog: Catalog) -> set[str]:
    return {e.path for e in catalog.files(TABLE, None, FileEntry)[2]}


def test_conditions_rule_out_files_by_partition_exactly_and_by_statistics_conservatively() -> None:
    f = entry("a", "d1", -5, 10, nulls=0)
    null_day = entry("b", None, 0, 0)
    assert day_is("d1").may_match(f) and not day_is("d2").may_match(f)
    assert not day_is("d1").may_match(null_day)  # SQL: null = 'd1' is not true
    assert Condition("day", IS_NULL, "str").may_match(null_day)
    assert Condition("day", IN, "str", ("d2", "d1")).may_match(f)
    assert Condition("amount", "<", "int", (-5,)).may_match(f) is False
    assert Condition("amount", "<=", "int", (-5,)).may_match(f)
    assert Condition("amount", ">", "int", (10,)).may_match(f) is False
    assert Condition("amount", "=", "int", (3,)).may_match(f)
    assert Condition("amount", IN, "int", (11, 12)).may_match(f) is False
    assert Condition("amount", IS_NULL, "int").may_match(f) is False  # no nulls recorded
    assert Condition("amount", NOT_NULL, "int").may_match(entry("c", "d1", 0, 0, nulls=10)) is False
    # What the file does not record, or records as another kind, may match.
    assert Condition("id", "=", "int", (1,)).may_match(f)
    assert Condition("amount", "=", "date", ("2024-01-01",)).may_match(f)
    day = Condition("day", ">=", "date", ("2024-02-01",))
    assert day.may_match(entry("d", "2024-10-01", 0, 0))  # dates compare as dates
    assert not day.may_match(entry("e", "2024-01-31", 0, 0))
    assert ReadSet(0, (), ()).may_match(f)  # no predicate: every row
    rebuilt = ReadSet.parse_conditions(ReadSet(0, (), (day, day_is("d1"))).conditions_json())
    assert rebuilt == (day, day_is("d1"))
    with pytest.raises(ValueError, match="condition"):
        ReadSet.parse_conditions('[["day", "like", "str", ["x"]]]')


def test_statements_on_disjoint_partitions_and_beside_other_appends_both_commit(
    catalog: Catalog,
) -> None:
    assert append(catalog, entry("d1-a", "d1", -5, 10), entry("d2-a", "d2", 0, 50)) == 1
    # Both statements read version 1; an append to d3 lands in between.
    assert append(catalog, entry("d3-a", "d3", 0, 1)) == 2
    assert dml(catalog, ReadSet(1, ("d1-a",), (day_is("d1"),)), entry("d1-b", "d1", 0, 10)) == 3
    # A new file in its own partition whose statistics rule it out: no conflict either.
    assert append(catalog, entry("d2-b", "d2", 0, 50)) == 4
    amount_over_100 = Condition("amount", ">", "int", (100,))
    assert dml(catalog, ReadSet(1, ("d2-a",), (day_is("d2"), amount_over_100))) == 5
    assert live(catalog) == {"d1-b", "d3-a", "d2-b"}
    history = {h.record.version: h for h in catalog.history(TABLE)}
    assert [e.path for e in history[3].added] == ["d1-b"]
    assert [e.path for e in history[3].removed] == ["d1-a"]
    assert history[5].added == [] and [e.path for e in history[5].removed] == ["d2-a"]


def test_a_statement_loses_to_a_removal_of_its_files_or_an_add_it_may_match(
    catalog: Catalog,
) -> None:
    append(catalog, entry("d1-a", "d1", -5, 10), entry("d2-a", "d2", 0, 50))
    assert dml(catalog, ReadSet(1, ("d1-a",), (day_is("d1"),))) == 2
    # Another statement that read version 1 rewrote d1-a too: it was removed meanwhile.
    with pytest.raises(ConcurrentModificationError, match=r"d1-a .*rewritten or removed"):
        dml(catalog, ReadSet(1, ("d1-a",), (day_is("d1"),)), entry("d1-c", "d1", 0, 1))
    # An append to d2 may hold rows an UPDATE of d2 that read before it would change.
    append(catalog, entry("d2-b", "d2", 0, 50))
    with pytest.raises(ConcurrentModificationError, match=r"d2-b .*may hold rows matching"):
        catalog.commit_files(
            TABLE,
            UPDATE,
            [entry("d2-c", "d2", 0, 50)],
            job_id="update-d2",
            job_started_ms=0,
            read_set=ReadSet(2, ("d2-a",), (day_is("d2"),)),
        )
    # No predicate reads every partition: any add conflicts.
    with pytest.raises(ConcurrentModificationError, match="d2-b"):
        dml(catalog, ReadSet(2, ("d2-a",), ()))
    assert catalog.prepare(TABLE).head.version == 3  # the losers committed nothing
    assert live(catalog) == {"d2-a", "d2-b"}
    with pytest.raises(ValueError, match="read set"):
        catalog.commit_files(TABLE, DELETE, [], job_id="no-read-set", job_started_ms=0)
