"""Vacuum's file side: remove what no version inside the retention can read.

Only job folders (``<location>/_lh_job=<id>/``) are ever touched: every file a
commit can name lives in one, and anything else in the location is left alone.
A file goes when no kept version names it and its job started before the
cutoff, side files (``_SUCCESS``, ``.crc``) with it, and then the folders that
emptied. The catalog fenced the cutoff before this runs: a job that started
before it can no longer commit, and the commit compares the same two numbers
(the start time in the job's folder name, and the cutoff), so clock skew between
machines cannot open a gap. Folders whose name carries no start time (written
by other tools, see ``Lakehouse.append_files``) fall back to the files' own
mtimes (an object's time on S3); no folder mtime is ever read, since object stores
have no folders.

A dropped table's files stay until a vacuum of its name (:func:`vacuum_dropped`):
the drop recorded the location, and once the retention has passed since the drop
the record is claimed and the location swept with nothing kept and the drop time as
the cutoff (``engine.lifecycle`` says why that never removes a newer table's file).
"""

from __future__ import annotations

import logging
import os
import posixpath

from spark_integration.engine import Catalog
from spark_integration.engine.errors import TableExistsError, TableNotFoundError
from spark_integration.engine.locations import is_object_store, relative_to
from spark_integration.service import RemoteCatalog
from spark_integration.spark import filesystem
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


def vacuum_table(catalog: Catalog | RemoteCatalog, name: str, cutoff_ms: int) -> list[str]:
    """``Lakehouse.vacuum``: of the table ``name``, or else of dropped tables of that name."""
    try:
        return vacuum(catalog, name, cutoff_ms)
    except TableNotFoundError:
        pass
    try:
        return vacuum_dropped(catalog, name, cutoff_ms)
    except TableExistsError:
        # A table of that name was created meanwhile: vacuum it (it may hold the
        # dropped table's files, which its own vacuum removes, see lifecycle).
        return vacuum(catalog, name, cutoff_ms)


def vacuum_dropped(catalog: Catalog | RemoteCatalog, name: str, cutoff_ms: int) -> list[str]:
    """Remove the files of tables named ``name`` dropped at or before ``cutoff_ms``.

    One transaction claims their records (``Catalog.claim_dropped``: no table of that
    name may exist, else :class:`TableExistsError`); then each location is swept with
    nothing kept and the drop time as the cutoff. Tables dropped later are left, and
    logged: an empty list then means the retention has not passed yet.

    Only job folders listed *before* the claim are swept. A table created at the
    location deletes the record in its own transaction: one created before the claim
    leaves nothing to claim, and one created after it had no folder yet when the
    listing ran. So no clock has to agree for the sweep to spare a new table's files.
    """
    # A cutoff below every drop time claims nothing: a read of the records.
    _, records = catalog.claim_dropped(name, -1)
    listed = {d.location: filesystem.list_dirs(d.location) for d in records}
    claimed, pending = catalog.claim_dropped(name, cutoff_ms)
    for d in pending:
        log.info(
            "vacuum of dropped table %s removed nothing at %s: dropped at %d ms, after the "
            "cutoff %d ms; its files stay until the retention has passed since the drop",
            name,
            d.location,
            d.dropped_ms,
            cutoff_ms,
        )
    deleted: list[str] = []
    for d in claimed:
        try:
            swept = sweep(d.location, set(), d.dropped_ms, listed.get(d.location, []))
        except Exception:
            # The record is gone: what the sweep left must be removed by hand.
            log.error("vacuum of dropped table %s failed to sweep %s", name, d.location)
            raise
        log.info("vacuum of dropped table %s removed %d paths at %s", name, len(swept), d.location)
        deleted += swept
    return deleted


def sweep(
    location: str, keep: set[str], cutoff_ms: int, folders: list[str] | None = None
) -> list[str]:
    """Delete unreferenced files of jobs older than ``cutoff_ms``; return the paths removed.

    ``keep`` holds paths relative to ``location``. One listing of the location's job
    folders (or ``folders``, listed earlier), then one listing per job folder old
    enough to sweep: on an object store that is what a sweep costs in requests,
    besides the deletes.
    """
    deleted: list[str] = []
    for job_dir in filesystem.list_dirs(location) if folders is None else folders:
        name = job_dir.rsplit("/", 1)[-1]
        # A local symlink is never followed; an S3 key is never a local path
        # (os.path would read "s3://b/k" as a relative folder "s3:").
        is_link = not is_object_store(job_dir) and os.path.islink(job_dir)
        if name.startswith(STAGING_PREFIX) and not is_link:
            deleted.extend(_sweep_job(location, job_dir, name, keep, cutoff_ms))
    return deleted


def _sweep_job(location: str, job_dir: str, name: str, keep: set[str], cutoff_ms: int) -> list[str]:
    started_ms = job_started_ms(name)
    if started_ms is not None and started_ms >= cutoff_ms:
        return []  # the job may still be running, or may commit later
    files: list[tuple[str, str, int | None]] = []  # (path, relative, mtime)
    for stored in filesystem.list_files(job_dir):
        rel = relative_to(location, stored.path)
        if rel is not None:
            files.append((stored.path, rel, stored.mtime_ms))
    job_is_live = any(rel in keep for _, rel, _ in files)
    deleted: list[str] = []
    for path, rel, mtime in files:
        # Foreign folders (no start time in the name) go by the file's own mtime;
        # a file without one is kept: it cannot be shown to be old.
        if rel in keep or (started_ms is None and (mtime is None or mtime >= cutoff_ms)):
            continue
        folder, _, base = rel.rpartition("/")
        # A checksum ".x.crc" goes with "x".
        owner = base[1:-4] if base.startswith(".") and base.endswith(".crc") else base
        if posixpath.join(folder, owner) in keep:
            continue
        if not is_data_file(owner) and job_is_live:
            continue  # _SUCCESS and the like of a job that still has live files
        if filesystem.delete_file(path):
            deleted.append(path)
    if started_ms is not None:
        # Local folders that emptied, deepest first; S3 has none (a prefix goes with
        # its last key). Foreign folders are left: only their files' mtimes are known.
        deleted.extend(filesystem.remove_empty_dirs(job_dir))
    if deleted:
        log.info("vacuum removed %d paths from %s", len(deleted), job_dir)
    return deleted
