"""The conflict rule of compaction (operation ``OPTIMIZE``) at the commit point, without Spark.

A compaction commits like a row-level statement (a read set naming the files it
rewrote, a new generation), but it changes no row: files added since its snapshot
never conflict with it, and only a commit that removed one of the files it rewrote
does. A statement that read a file the compaction removed loses as it would to any
rewrite. The catalog is the embedded one on an in-memory store; files are metadata.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from spark_integration.engine import Catalog, ConcurrentModificationError
from spark_integration.engine.model import (
    APPEND,
    DELETE,
    OPTIMIZE,
    ColumnStats,
    FileEntry,
    TableMeta,
)
from spark_integration.engine.read_set import Condition, ReadSet
from txn import TransactionConfig, TransactionManager

TABLE = "events"


def entry(path: str, day: str, rows: int = 10) -> FileEntry:
    return FileEntry(path, 100, rows, {"day": day}, {"amount": ColumnStats(0, 0, 9)})


@pytest.fixture
def catalog() -> Iterator[Catalog]:
    tm = TransactionManager.embedded("memory://", config=TransactionConfig(settle_backoff_ms=1))
    catalog = Catalog(tm, "lakehouse")
    catalog.create(TableMeta(TABLE, "{}", ("day",), "/nowhere/events", 0), job_id="create")
    yield catalog
    tm.close()


def commit(catalog: Catalog, operation: str, read_set: ReadSet | None, *files: FileEntry) -> int:
    return catalog.commit_files(
        TABLE,
        operation,
        files,
        job_id=f"{operation}-{uuid.uuid4().hex}",
        job_started_ms=0,
        read_set=read_set,
    ).version


def live(catalog: Catalog) -> set[str]:
    return {e.path for e in catalog.files(TABLE, None, FileEntry)[2]}


def test_compaction_commits_beside_appends_even_to_the_partition_it_rewrote(
    catalog: Catalog,
) -> None:
    assert commit(catalog, APPEND, None, entry("a", "d1"), entry("b", "d1")) == 1
    # Appends to the very partition it compacts land after its snapshot (version 1).
    assert commit(catalog, APPEND, None, entry("c", "d1")) == 2
    assert commit(catalog, APPEND, None, entry("d", "d2")) == 3
    compacted = entry("ab", "d1", rows=20)
    assert commit(catalog, OPTIMIZE, ReadSet(1, ("a", "b")), compacted) == 4
    assert live(catalog) == {"ab", "c", "d"}
    history = {h.record.version: h for h in catalog.history(TABLE)}
    assert history[4].record.operation == OPTIMIZE
    assert [e.path for e in history[4].added] == ["ab"]
    assert sorted(e.path for e in history[4].removed) == ["a", "b"]
    # Time travel: version 3 still names the small files.
    assert {e.path for e in catalog.files(TABLE, 3, FileEntry)[2]} == {"a", "b", "c", "d"}


def test_compaction_loses_only_to_a_commit_that_removed_a_file_it_rewrote(
    catalog: Catalog,
) -> None:
    commit(catalog, APPEND, None, entry("a", "d1"), entry("b", "d1"), entry("x", "d2"))
    # A DELETE of partition d2 removed a file the compaction does not touch: no conflict.
    d2 = Condition("day", "=", "str", ("d2",))
    assert commit(catalog, DELETE, ReadSet(1, ("x",), (d2,))) == 2
    # A DELETE that rewrote b: the compaction (which read version 1) would bring b back.
    d1 = Condition("day", "=", "str", ("d1",))
    assert commit(catalog, DELETE, ReadSet(1, ("b",), (d1,)), entry("b2", "d1", rows=5)) == 3
    with pytest.raises(ConcurrentModificationError, match=r"file b .*rewritten or removed"):
        commit(catalog, OPTIMIZE, ReadSet(1, ("a", "b")), entry("ab", "d1", rows=20))
    assert catalog.prepare(TABLE).head.version == 3  # nothing committed
    assert live(catalog) == {"a", "b2"}


def test_a_statement_that_read_a_file_the_compaction_removed_loses(catalog: Catalog) -> None:
    commit(catalog, APPEND, None, entry("a", "d1"), entry("b", "d1"), entry("x", "d2"))
    assert commit(catalog, OPTIMIZE, ReadSet(1, ("a", "b")), entry("ab", "d1", rows=20)) == 2
    d1 = Condition("day", "=", "str", ("d1",))
    with pytest.raises(ConcurrentModificationError, match=r"file a .*rewritten or removed"):
        commit(catalog, DELETE, ReadSet(1, ("a",), (d1,)))
    # One that read only another partition commits beside it: the compacted file is
    # an add in d1, which its conditions rule out.
    d2 = Condition("day", "=", "str", ("d2",))
    assert commit(catalog, DELETE, ReadSet(1, ("x",), (d2,))) == 3
    assert live(catalog) == {"ab"}
