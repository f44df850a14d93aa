"""History of a range of versions reads only that range (issue 26: the change feed's planning).

``Catalog.history(name, from_version=, to_version=)`` must give exactly the entries
the full history gives for those versions (added and removed files, across
generation rollovers and checkpoints), and read only the log records of the versions
asked; ``plan_changes`` plans a range through it. The catalog is the embedded one over
the memory store; files are metadata only.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import spark_integration.engine.checkpoints as checkpoints_module
from spark_integration.engine import Catalog
from spark_integration.engine.model import (
    APPEND,
    DELETE,
    OVERWRITE,
    UPDATE,
    FileEntry,
    Layout,
    TableMeta,
)
from spark_integration.engine.read_set import ReadSet
from tests.unit.test_lakehouse_metadata import count_scanned_rows
from txn import EmbeddedTransaction, TransactionManager

pytestmark = pytest.mark.unit

TABLE = "t"
SCHEMA_JSON = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


@pytest.fixture
def catalog(monkeypatch: pytest.MonkeyPatch) -> Iterator[Catalog]:
    """A table of 40 random versions: appends, overwrites and rewrites, with a
    checkpoint every 3 versions of a generation (rewrites roll generations over)."""
    monkeypatch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", 3)
    monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 2)
    tm = TransactionManager.embedded("memory://")
    catalog = Catalog(tm, "lakehouse")
    catalog.create(TableMeta(TABLE, SCHEMA_JSON, (), "/nowhere/t", 1), "create")
    rng = random.Random(7)
    live: list[str] = []
    for step in range(40):
        head = catalog.prepare(TABLE).head.version
        kind = rng.random()
        new = [f"p{step}-{i}" for i in range(rng.randint(1, 3))]
        if kind < 0.4 or not live:
            operation, removes = APPEND, ()
            live = [*live, *new]
        elif kind < 0.5:
            operation, removes = OVERWRITE, ()
            live = new
        else:
            removes = tuple(rng.sample(live, rng.randint(1, min(3, len(live)))))
            operation = rng.choice([UPDATE, DELETE])
            live = [p for p in live if p not in removes] + new
        catalog.commit_files(
            TABLE,
            operation,
            [FileEntry(p, 100, 10) for p in new],
            job_id=f"{operation}-{uuid.uuid4().hex}",
            job_started_ms=0,
            read_set=ReadSet(head, removes) if operation in (UPDATE, DELETE) else None,
            base_version=head if operation == OVERWRITE else None,
        )
    assert catalog.prepare(TABLE).head.gen > 2  # the ranges cross generations
    yield catalog
    tm.close()


def log_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Counts the log cells every transaction's scans yield, by version."""
    seen: Counter[int] = Counter()
    real_scan = EmbeddedTransaction.scan

    def counting_scan(self: EmbeddedTransaction, table: str, *args: Any) -> Iterator[Any]:
        for row, column, value in real_scan(self, table, *args):
            if table.endswith(".log"):
                seen[Layout.version_of_log_row(TABLE, row)] += 1
            yield row, column, value

    monkeypatch.setattr(EmbeddedTransaction, "scan", counting_scan)
    return seen


def test_a_range_of_history_is_the_full_history_of_those_versions(catalog: Catalog) -> None:
    full = catalog.history(TABLE)
    head = full[-1].record.version
    assert [h.record.version for h in full] == list(range(head + 1))
    for start, end in [(0, head), (0, 0), (5, 9), (12, 12), (17, None), (head, None), (3, 99)]:
        last = head if end is None else min(end, head)
        got = catalog.history(TABLE, from_version=start, to_version=end)
        assert got == full[start : last + 1], (start, end)
    assert catalog.history(TABLE, from_version=head + 1) == []


def test_a_range_reads_only_its_own_log_records(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = log_reads(monkeypatch)
    catalog.history(TABLE, from_version=20, to_version=24)
    assert set(seen) == set(range(20, 25)), sorted(seen)
    seen.clear()
    catalog.history(TABLE)  # the whole history reads every record
    assert set(seen) == set(range(catalog.prepare(TABLE).head.version + 1))


def test_the_change_feed_plans_a_range_from_its_versions_only(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark")
    from spark_integration.spark.changes import plan_changes

    full = {h.record.version: h for h in catalog.history(TABLE)}
    seen = log_reads(monkeypatch)
    plan = plan_changes(catalog, TABLE, 30, 33)
    assert set(seen) == set(range(30, 34)), sorted(seen)
    assert (plan.start, plan.end) == (30, 33)
    for version in range(30, 34):
        h = full[version]
        # Every version here added or removed files: its pieces are those files.
        pieces = [p for p in plan.pieces if p.version == version]
        got = {p.change_type: {f.path for f in p.files} for p in pieces}
        want = {
            kind: {f.path for f in files}
            for kind, files in (("delete", h.removed), ("insert", h.added))
            if files
        }
        assert got == want, version


def test_a_range_finds_the_checkpoint_of_the_generation_it_rolled_over_without_a_scan(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version that started a generation removed the files of the one before, listed
    from that generation's checkpoint: read where one is due, from the generation's
    first version, even when the range starts at the rolling version (the generation
    before lies below the range)."""
    full = catalog.history(TABLE)
    starts: dict[int, int] = {}
    for h in full:
        starts.setdefault(h.record.gen, h.record.version)
    # Versions that rolled over a generation with a checkpoint due below them.
    rolled = [
        h.record.version
        for h in full
        if h.record.gen > 0
        and starts[h.record.gen] == h.record.version
        and checkpoints_module.due_at_or_below(h.record.version - 1 - starts[h.record.gen - 1])
    ]
    assert rolled, "the fixture rolls over a generation with a checkpoint"
    scanned = count_scanned_rows(monkeypatch)
    for version in rolled:
        scanned.clear()
        assert catalog.history(TABLE, from_version=version, to_version=version) == [full[version]]
        assert not [t for t in scanned if t.endswith(".checkpoints")], version
