"""Vacuum's file side: remove what no version inside the retention can read.

Only job folders (``<location>/_lh_job=<id>/``) are ever touched: every file a
commit can name lives in one, and anything else in the location is left alone.
A file goes when no kept version names it and its job started before the
cutoff, side files (``_SUCCESS``, ``.crc``) with it, and then the folders that
emptied. The catalog fenced the cutoff before this runs: a job that started
before it can no longer commit, and the commit compares the same two numbers
(the start time in the job's folder name, and the cutoff), so clock skew between
machines cannot open a gap. Folders whose name carries no start time (written
by other tools, see ``Lakehouse.append_files``) fall back to file mtimes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from spark_integration.engine import Catalog
from spark_integration.service import RemoteCatalog
from spark_integration.spark.hook import STAGING_PREFIX, is_data_file, job_started_ms

log = logging.getLogger(__name__)


def vacuum(catalog: Catalog | RemoteCatalog, name: str, cutoff_ms: int) -> list[str]:
    """Vacuum table ``name`` with ``cutoff_ms``: plan, fence, sweep; returns the paths removed.

    The plan (what versions inside the retention read) and the fence (the cutoff
    published in the head, and the files committed since the plan) are the
    catalog's; the sweep is this module's.
    """
    plan = catalog.vacuum_plan(name, cutoff_ms)
    since = catalog.vacuum_fence(name, plan, cutoff_ms)
    deleted = sweep(plan.meta.location, plan.referenced | since, cutoff_ms)
    log.info(
        "vacuum of %s (cutoff %d ms) removed %d paths; versions from %d stay readable",
        name,
        cutoff_ms,
        len(deleted),
        plan.min_readable_version,
    )
    return deleted


def _mtime_ms(st: os.stat_result) -> int:
    return st.st_mtime_ns // 1_000_000


def sweep(location: str, keep: set[str], cutoff_ms: int) -> list[str]:
    """Delete unreferenced files of jobs older than ``cutoff_ms``; return the paths removed.

    ``keep`` holds paths relative to ``location``.
    """
    root = Path(location)
    if not root.is_dir():
        return []
    deleted: list[str] = []
    for job_dir in sorted(root.iterdir()):
        if (
            job_dir.name.startswith(STAGING_PREFIX)
            and job_dir.is_dir()
            and not job_dir.is_symlink()
        ):
            deleted.extend(_sweep_job(location, job_dir, keep, cutoff_ms))
    return deleted


def _sweep_job(location: str, job_dir: Path, keep: set[str], cutoff_ms: int) -> list[str]:
    started_ms = job_started_ms(job_dir.name)
    if started_ms is not None and started_ms >= cutoff_ms:
        return []  # the job may still be running, or may commit later
    # Take every mtime before deleting anything: deleting a file touches its folder.
    folders: list[tuple[str, int]] = []
    files: list[tuple[str, str, int]] = []  # (absolute, relative, mtime)
    for current, _, names in os.walk(job_dir):
        try:
            folders.append((current, _mtime_ms(os.lstat(current))))
        except FileNotFoundError:
            continue
        for name in names:
            absolute = os.path.join(current, name)
            try:
                mtime = _mtime_ms(os.lstat(absolute))
            except FileNotFoundError:
                continue
            files.append((absolute, os.path.relpath(absolute, location), mtime))
    job_is_live = any(rel in keep for _, rel, _ in files)
    deleted: list[str] = []
    for absolute, rel, mtime in files:
        if rel in keep or (started_ms is None and mtime >= cutoff_ms):
            continue
        name = os.path.basename(rel)
        # A checksum ".x.crc" goes with "x".
        owner = name[1:-4] if name.startswith(".") and name.endswith(".crc") else name
        if os.path.join(os.path.dirname(rel), owner) in keep:
            continue
        if not is_data_file(owner) and job_is_live:
            continue  # _SUCCESS and the like of a job that still has live files
        try:
            os.unlink(absolute)
        except FileNotFoundError:
            continue
        deleted.append(absolute)
    # Deepest first, so a folder is empty by the time its parent is tried.
    for folder, mtime in sorted(folders, key=lambda item: item[0].count(os.sep), reverse=True):
        if started_ms is None and mtime >= cutoff_ms:
            continue
        try:
            os.rmdir(folder)
        except OSError:
            continue  # not empty: something in it is kept, or was written just now
        deleted.append(folder)
    if deleted:
        log.info("vacuum removed %d paths from %s", len(deleted), job_dir)
    return deleted
