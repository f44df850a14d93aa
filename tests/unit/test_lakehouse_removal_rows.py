"""Row-level commits write what they changed: removal rows, bounded by a new generation.

A ``DELETE``/``UPDATE``/``MERGE``/``OPTIMIZE`` commit writes a removal row per file
it rewrote and a file row per file it wrote, not a row per live file; once a
generation's removal rows would outnumber its live files, the next such commit
starts a new generation of the live files instead. Every version must read as a
model of the table says, through time travel, history, checkpoints, vacuum's plan
and expiry. The catalog is the embedded one; files are metadata only.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import spark_integration.engine.checkpoints as checkpoints_module
from spark_integration.engine import Catalog
from spark_integration.engine.model import (
    APPEND,
    DELETE,
    OPTIMIZE,
    OVERWRITE,
    UPDATE,
    FileEntry,
    Generation,
    Layout,
    TableMeta,
)
from spark_integration.engine.read_set import ReadSet
from spark_integration.engine.retention import Retention
from txn import EmbeddedTransaction, TransactionConfig, TransactionManager

TABLE = "t"
T0_MS = 1_700_000_000_000


class Clock:
    """The catalog's wall clock, moved by the test."""

    def __init__(self) -> None:
        self.ms = T0_MS

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(params=["memory", "sqlite"])
def tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"
    manager = TransactionManager.embedded(url, config=TransactionConfig(settle_backoff_ms=1))
    yield manager
    manager.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def new_catalog(
    tm: TransactionManager, clock: Clock, retention: Retention | None = None
) -> Catalog:
    catalog = Catalog(tm, "lakehouse", clock_ms=clock)
    catalog.create(TableMeta(TABLE, "{}", (), "/nowhere/t", T0_MS), "create", retention)
    return catalog


def entry(path: str) -> FileEntry:
    return FileEntry(path, 100, 10)


def commit(
    catalog: Catalog,
    operation: str,
    files: list[str],
    removes: tuple[str, ...] = (),
    base: int | None = None,
) -> int:
    head = catalog.prepare(TABLE).head.version
    row_level = operation in (DELETE, UPDATE, OPTIMIZE)
    return catalog.commit_files(
        TABLE,
        operation,
        [entry(p) for p in files],
        job_id=f"{operation}-{uuid.uuid4().hex}",
        job_started_ms=0,
        read_set=ReadSet(head, removes) if row_level else None,
        base_version=head if operation == OVERWRITE else base,
    ).version


def listing(catalog: Catalog, version: int | None = None) -> list[str]:
    return [e.path for e in catalog.files(TABLE, version, FileEntry)[2]]


def file_cells(tm: TransactionManager) -> list[tuple[bytes, bytes]]:
    with tm.begin() as tx:
        return [(row, column) for row, column, _ in tx.scan("lakehouse.files")]


def gen_of_head(catalog: Catalog) -> int:
    return catalog.prepare(TABLE).head.gen


def test_a_one_file_delete_writes_rows_for_what_it_changed(
    tm: TransactionManager, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = new_catalog(tm, clock)
    n = 1000
    commit(catalog, APPEND, [f"f{i}" for i in range(n)])
    before = file_cells(tm)
    puts: list[str] = []
    real_put = EmbeddedTransaction.put

    def counting_put(self: EmbeddedTransaction, table: str, *args: Any, **kwargs: Any) -> Any:
        puts.append(table)
        return real_put(self, table, *args, **kwargs)

    monkeypatch.setattr(EmbeddedTransaction, "put", counting_put)
    version = commit(catalog, DELETE, ["f7-rewritten"], removes=("f7",))
    monkeypatch.undo()
    # One removal row and one file row, not a row per live file.
    assert puts.count("lakehouse.files") == 2
    assert len(puts) <= 8, puts  # head, log, marks, the generation's count
    after = file_cells(tm)
    assert len(after) - len(before) == 2
    assert (Layout.COL_REMOVE in {column for _, column in after}) is True
    assert gen_of_head(catalog) == 0
    expected = [f"f{i}" for i in range(n) if i != 7] + ["f7-rewritten"]
    assert listing(catalog) == expected
    assert len(listing(catalog, version - 1)) == n
    h = catalog.history(TABLE)[-1]
    assert h.record.operation == DELETE
    assert [e.path for e in h.added] == ["f7-rewritten"]
    assert [e.path for e in h.removed] == ["f7"]


def test_the_generation_rolls_over_at_the_bound_and_every_version_reads_the_same(
    tm: TransactionManager, clock: Clock
) -> None:
    catalog = new_catalog(tm, clock)
    live = [f"a{i}" for i in range(6)]
    commit(catalog, APPEND, live)
    model: dict[int, list[str]] = {1: list(live)}
    gens: dict[int, int] = {1: 0}
    for step in range(14):  # each rewrites one file: six live files throughout
        old = live[0]
        new = f"b{step}"
        version = commit(catalog, UPDATE, [new], removes=(old,))
        live = [*live[1:], new]
        model[version] = list(live)
        gens[version] = gen_of_head(catalog)
    # Removal rows 1..6 fit beside six live files; the 7th would outnumber them, so
    # that statement starts generation 1, which holds six more before generation 2.
    assert [gens[v] for v in sorted(gens)] == [0] * 7 + [1] * 7 + [2]
    for version, files in model.items():
        assert sorted(listing(catalog, version)) == sorted(files), version
    history = {h.record.version: h for h in catalog.history(TABLE)}
    for version in range(2, max(model) + 1):
        added = set(model[version]) - set(model[version - 1])
        removed = set(model[version - 1]) - set(model[version])
        assert {e.path for e in history[version].added} == added, version
        assert {e.path for e in history[version].removed} == removed, version


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_commits_with_checkpoints_read_as_a_model(
    tm: TransactionManager, clock: Clock, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Appends, overwrites and rewrites, with a checkpoint every 3 versions of a
    generation and 2 files a chunk: removals before and after checkpoints."""
    monkeypatch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", 3)
    monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 2)
    rng = random.Random(seed)
    catalog = new_catalog(tm, clock)
    model: dict[int, list[str]] = {0: []}
    counter = 0

    def fresh(k: int) -> list[str]:
        nonlocal counter
        counter += k
        return [f"p{counter - i}" for i in range(k)]

    for _ in range(40):
        live = model[max(model)]
        kind = rng.random()
        if kind < 0.4 or not live:
            files = fresh(rng.randint(1, 3))
            model[commit(catalog, APPEND, files)] = [*live, *files]
        elif kind < 0.5:
            files = fresh(rng.randint(1, 4))
            model[commit(catalog, OVERWRITE, files)] = files
        else:
            removes = tuple(rng.sample(live, rng.randint(1, min(3, len(live)))))
            files = fresh(rng.randint(0, 2))
            op = rng.choice([DELETE, UPDATE, OPTIMIZE])
            kept = [p for p in live if p not in removes]
            model[commit(catalog, op, files, removes)] = [*kept, *files]
    for version, files in model.items():
        got = listing(catalog, version)
        assert len(got) == len(set(got)), version
        assert sorted(got) == sorted(files), version
    history = {h.record.version: h for h in catalog.history(TABLE)}
    for version in range(1, max(model) + 1):
        added = set(model[version]) - set(model[version - 1])
        removed = set(model[version - 1]) - set(model[version])
        assert {e.path for e in history[version].added} == added, version
        assert {e.path for e in history[version].removed} == removed, version


def test_vacuum_keeps_a_removed_file_while_the_version_before_its_removal_is_retained(
    tm: TransactionManager, clock: Clock
) -> None:
    catalog = new_catalog(tm, clock)
    commit(catalog, APPEND, ["a", "b", "c", "d", "e"])
    clock.ms += 1000
    commit(catalog, DELETE, ["a2"], removes=("a",))  # version 2, replaced version 1 at +1000
    clock.ms += 1000
    commit(catalog, DELETE, ["b2"], removes=("b",))  # version 3, at +2000
    assert gen_of_head(catalog) == 0
    plan = catalog.vacuum_plan(TABLE, T0_MS + 1500)
    # Version 1 went out of the retention at +1000: file a may go, and versions
    # before its removal are no longer readable. Version 2 is retained: b stays.
    assert plan.referenced == {"b", "c", "d", "e", "a2", "b2"}
    assert plan.min_readable_version == 2
    plan = catalog.vacuum_plan(TABLE, T0_MS + 500)
    assert plan.referenced == {"a", "b", "c", "d", "e", "a2", "b2"}
    assert plan.min_readable_version == 0


def test_expiry_removes_removal_rows_with_their_versions_and_keeps_readable_ones(
    tm: TransactionManager, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", 4)
    catalog = new_catalog(tm, clock, Retention(log_retention_s=10, mark_retention_s=0))
    model: dict[int, list[str]] = {0: []}
    live: list[str] = []
    for k in range(12):
        clock.ms += 1000
        if k % 3 == 2:
            version = commit(catalog, DELETE, [f"r{k}"], removes=(live[0],))
            live = [*live[1:], f"r{k}"]
        else:
            version = commit(catalog, APPEND, [f"x{k}", f"y{k}"])
            live = [*live, f"x{k}", f"y{k}"]
        model[version] = list(live)
    history = {h.record.version: h for h in catalog.history(TABLE)}
    rows_before = len(file_cells(tm))
    clock.ms += 6500  # versions replaced more than 10 s ago expire
    done = catalog.expire(TABLE, clock())
    readable = done.readable_from
    assert 0 < readable < max(model)
    assert len(file_cells(tm)) < rows_before
    for version in range(readable, max(model) + 1):
        assert sorted(listing(catalog, version)) == sorted(model[version]), version
    for h in catalog.history(TABLE):
        assert h == history[h.record.version]
    # Every readable version keeps its rows (each added a file, some removed one).
    with tm.begin() as tx:
        versions = {
            Layout.parse_file_row(TABLE, row)[1] for row, _, _ in tx.scan("lakehouse.files")
        }
    assert set(range(readable, max(model) + 1)) <= versions


def test_a_generation_written_before_removal_rows_reads_as_none_removed() -> None:
    old_cell = b'{"g":3,"v":17,"ms":5}'
    assert Generation.decode(old_cell) == Generation(3, 17, 5, 0)
    assert Generation.decode(Generation(3, 17, 5, 4).encode()).removed == 4
    assert Generation(3, 17, 5).encode() == old_cell  # no count: the old encoding
