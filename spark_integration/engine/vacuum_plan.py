"""Vacuum's catalog side: which files the retention keeps, and fencing the cutoff.

``Catalog.vacuum_plan`` reads, at one snapshot, the files every version inside
the retention can read (:func:`plan_vacuum`); ``Catalog.vacuum_fence`` then
publishes the cutoff in the table's head (:func:`fence_vacuum`), so that no job
that started before it can commit; only then does ``spark.vacuum_sweep`` (the file side)
remove what the plan does not keep. Like the catalog, no Spark is involved.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from spark_integration.engine.checkpoints import list_gen
from spark_integration.engine.model import (
    FileEntry,
    Generation,
    Head,
    Layout,
    LogRecord,
    TableMeta,
)
from txn import Transaction


@dataclass(frozen=True, slots=True)
class VacuumPlan:
    meta: TableMeta
    head: Head
    #: Files of every generation from this one on are kept.
    keep_from_gen: int
    referenced: set[str]  # relative paths
    min_readable_version: int


def plan_vacuum(
    tx: Transaction,
    layout: Layout,
    name: str,
    meta: TableMeta,
    head: Head,
    gens: Sequence[Generation],
    cutoff_ms: int,
) -> VacuumPlan:
    """Which files the versions inside the retention can read, at ``tx``'s snapshot.

    ``meta``, ``head`` and ``gens`` are the table's, read in ``tx``. A version is
    inside the retention while it is the latest or was replaced at or after
    ``cutoff_ms``. Files leave the live set only when an overwrite or a row-level
    statement ends their generation, so the files of a generation are needed until
    the commit that ended it is older than the cutoff.
    """
    keep_from = head.gen
    for older, newer in itertools.pairwise(gens):
        if newer.started_ms >= cutoff_ms:
            keep_from = older.gen
            break
    referenced: set[str] = set()
    for g, successor in itertools.zip_longest(gens, gens[1:]):
        if g.gen < keep_from:
            continue
        last = head.version if successor is None else successor.start_version - 1
        referenced.update(e.path for e in list_gen(tx, layout, name, g.gen, last, FileEntry))
    start_version = next((g.start_version for g in gens if g.gen == keep_from), 0)
    referenced.update(_change_paths(tx, layout, name, start_version))
    return VacuumPlan(meta, head, keep_from, referenced, start_version)


def _change_paths(tx: Transaction, layout: Layout, name: str, from_version: int) -> Iterator[str]:
    """The change files (change data feed) of versions from ``from_version`` on: kept
    as long as their version stays readable, like the data files it reads."""
    start, end = Layout.log_row(name, from_version), Layout.prefix_end(name)
    for _, column, value in tx.scan(layout.log, start, end):
        if column == Layout.COL_RECORD:
            yield from (e.path for e in LogRecord.decode(value).changes)


def fence_vacuum(
    tx: Transaction, layout: Layout, name: str, head: Head, plan: VacuumPlan, cutoff_ms: int
) -> set[str]:
    """Publish the cutoff in the head; returns files committed since the plan.

    ``head`` is the table's, read in ``tx``. Writing it conflicts with every
    commit: a commit that wins first is seen here and its files are kept; one
    that comes later sees the cutoff and refuses to commit files that may be
    removed.
    """
    since: set[str] = set()
    if head.version > plan.head.version:
        start, end = Layout.file_range(name, plan.head.gen, from_version=plan.head.version + 1)
        since.update(_paths(tx, layout, start, end))
        if head.gen > plan.head.gen:
            start, end = Layout.files_from_gen(name, plan.head.gen + 1)
            since.update(_paths(tx, layout, start, end))
        since.update(_change_paths(tx, layout, name, plan.head.version + 1))
    fenced = dataclasses.replace(
        head,
        vacuum_cutoff_ms=max(head.vacuum_cutoff_ms, cutoff_ms),
        min_readable_version=max(head.min_readable_version, plan.min_readable_version),
    )
    tx.put(layout.head, Layout.name_row(name), Layout.COL_HEAD, fenced.encode())
    return since


def _paths(tx: Transaction, layout: Layout, start: bytes, end: bytes) -> Iterator[str]:
    """Relative paths of the file rows in ``[start, end)``."""
    for _, _, value in tx.scan(layout.files, start, end):
        yield FileEntry.decode(value).path
