"""The commit hook: a job folder of fresh files, committed as one version or removed.

Lakehouse appends and whole-table overwrites run here, so that the order of the steps
(prepare, write, commit, clean up) and what each failure leaves behind read in one
place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql.types import StructType

from spark_integration.engine import Catalog
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.model import OVERWRITE, FileEntry
from spark_integration.service.client import RemoteCatalog
from spark_integration.spark import filesystem, schema_change
from spark_integration.spark.hook import Job, collect_files, new_job
from txn.errors import TransactionAbortedError

log = logging.getLogger(__name__)

#: ``write(job, table_schema, partition_by)``: the files written, or None to list them.
Writer = Callable[[Job, StructType, tuple[str, ...]], list[FileEntry] | None]


def run_job(
    catalog: Catalog | RemoteCatalog,
    failpoints: fp.FailPoints,
    operation: str,
    name: str,
    source_schema: StructType,
    write: Writer,
    app_id: str | None,
    batch_id: int | str | None,
    evolve: tuple[bool, bool] = (False, False),
) -> int:
    """The commit hook: ``write`` fills a fresh job folder, whose files are committed.

    ``write(job, table_schema, partition_by)`` is Spark's tasks for
    ``append``/``overwrite`` (they report the files they wrote); tests pass other
    writers (pyarrow) to run this very path without Spark, and when a writer
    returns None the job folder is listed for its files.
    """
    prepared = catalog.prepare(name, app_id, batch_id)
    if prepared.replayed_version is not None:
        log.info("%s to %s: (%s, %r) committed before", operation, name, app_id, batch_id)
        return prepared.replayed_version
    meta = prepared.meta
    schema, new_schema = schema_change.target(name, meta, source_schema, *evolve)
    job = new_job(meta.location)
    failpoints.hit(fp.BEFORE_WRITE, job.job_id)
    try:
        reported = write(job, schema, meta.partition_by)
        failpoints.hit(fp.AFTER_WRITE, job.job_id)
        files = (
            collect_files(meta.location, job, meta.partition_by) if reported is None else reported
        )
        failpoints.hit(fp.BEFORE_COMMIT, job.job_id)
    except Exception:
        # The commit was never attempted, so nothing can name these files.
        remove_staging(job.staging)
        raise
    try:
        committed = catalog.commit_files(
            name,
            operation,
            files,
            job_id=job.job_id,
            job_started_ms=job.started_ms,
            app_id=app_id,
            batch_id=batch_id,
            base_version=prepared.head.version if operation == OVERWRITE else None,
            schema_version=prepared.head.schema_version,
            new_schema_json=new_schema,
        )
    except TransactionAbortedError:
        # Definitely not committed (a conflict at the head, a stale overwrite, a
        # vacuum's fence): nothing names these files, so they can go right away.
        remove_staging(job.staging)
        raise
    # Any other failure propagates with the files left in place: CommitUnknownError
    # may hide a committed version, and a store, oracle or gateway error may have
    # come after the commit point for all we know. Deleting would leave a committed
    # version naming missing files; keeping costs only disk until vacuum removes
    # the files that no version names.
    if committed.replayed:
        remove_staging(job.staging)
        log.info("%s to %s lost to its own replay; version %d", operation, name, committed.version)
        return committed.version
    failpoints.hit(fp.AFTER_COMMIT, job.job_id)
    log.info(
        "%s committed %s version %d (%d files, job %s)",
        operation.lower(),
        name,
        committed.version,
        len(files),
        job.job_id,
    )
    return committed.version


def remove_staging(staging: str) -> None:
    """Best effort: a straggling task may still write here; vacuum removes what is left."""
    filesystem.delete_tree(staging)
