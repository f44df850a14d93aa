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
    ``cutoff_ms``. Files leave the live set when an overwrite or a row-level
    statement ends their generation, so the files of a generation are needed until
    the commit that ended it is older than the cutoff; and when a row-level
    statement's removal row removes them within one, so a file removed at version
    ``r`` is needed while version ``r - 1`` is, until ``r``'s log time is older than
    the cutoff. Removals older than it make the versions before them unreadable:
    the oldest readable version rises to the newest such removal.
    """
    keep_from = head.gen
    for older, newer in itertools.pairwise(gens):
        if newer.started_ms >= cutoff_ms:
            keep_from = older.gen
            break
    referenced: set[str] = set()
    start_version = next((g.start_version for g in gens if g.gen == keep_from), 0)
    readable_from = start_version
    for g, successor in itertools.zip_longest(gens, gens[1:]):
        if g.gen < keep_from:
            continue
        last = head.version if successor is None else successor.start_version - 1
        listed = list_gen(tx, layout, name, g.gen, last, FileEntry, gen_start=g.start_version)
        referenced.update(e.path for e in listed)
        if g.removed:  # generations written before removal rows existed have none
            for version, paths in _removals(tx, layout, name, g.gen, last, cutoff_ms):
                if paths is None:
                    readable_from = max(readable_from, version)
                else:
                    referenced.update(paths)
    referenced.update(_change_paths(tx, layout, name, start_version))
    return VacuumPlan(meta, head, keep_from, referenced, readable_from)


def _removals(
    tx: Transaction, layout: Layout, name: str, gen: int, last: int, cutoff_ms: int
) -> Iterator[tuple[int, list[str] | None]]:
    """``(version, paths)`` of each version of ``gen`` up to ``last`` with removal rows:
    the paths it removed if the version before it is inside the retention (its log
    time is at or after ``cutoff_ms``), else ``None`` (they may go)."""
    by_version: dict[int, list[str]] = {}
    start, end = Layout.file_range(name, gen, below_version=last + 1)
    for row, column, value in tx.scan(layout.files, start, end):
        if column == Layout.COL_REMOVE:
            version = Layout.parse_file_row(name, row)[1]
            by_version.setdefault(version, []).append(FileEntry.decode(value).path)
    cells = [(Layout.log_row(name, v), Layout.COL_RECORD) for v in by_version]
    found = tx.get_many(layout.log, cells)
    for (row, _), paths in zip(cells, by_version.values(), strict=True):
        raw = found.get((row, Layout.COL_RECORD))
        # No record: the version expired, so the one before it is unreadable anyway.
        inside = raw is not None and LogRecord.decode(raw).timestamp_ms >= cutoff_ms
        yield Layout.version_of_log_row(name, row), paths if inside else None


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
    """Relative paths of the files the file rows in ``[start, end)`` added (a removal
    row names a file added before, which the plan already saw)."""
    for _, column, value in tx.scan(layout.files, start, end):
        if column == Layout.COL_FILE:
            yield FileEntry.decode(value).path
