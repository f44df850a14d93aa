"""Batch writes: ``df.write.format("percolake")``, one job folder and one version per job."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from spark_integration.engine.locations import join
from spark_integration.spark import filesystem
from spark_integration.spark.datasource.files import write_batches
from spark_integration.spark.datasource.gateway import open_gateway
from spark_integration.spark.datasource.options import (
    PARTITION_OVERWRITE_CONF,
    dynamic_overwrite_refused,
)
from spark_integration.spark.datasource.write_plan import (
    FilesWritten,
    WriteTarget,
    files_of,
    remove_folders,
    task_tag,
)
from txn.errors import TransactionAbortedError

log = logging.getLogger(__name__)

#: Written into a job folder just before its commit is sent: from then on the files
#: may be named by a version, and ``abort`` leaves them alone. On S3 it is one PUT,
#: acknowledged before the commit is sent, and S3 (as MinIO) reads its own writes
#: strongly: an ``abort`` that runs after the commit was sent always finds it. An
#: ``abort`` that cannot tell (the store does not answer) deletes nothing either.
COMMITTING_MARKER = "_committing"


@dataclass(frozen=True, slots=True)
class WritePlan:
    target: WriteTarget
    operation: str
    job_id: str
    job_started_ms: int
    staging: str
    base_version: int | None
    app_id: str | None
    batch_id: int | None
    #: The version an earlier write with the same (app_id, batch_id) committed.
    replayed_version: int | None
    #: An overwrite without option partitionOverwriteMode: its tasks refuse to run when
    #: the session asks for dynamic partition overwrite (see ``_session_overwrite_mode``).
    check_session_overwrite_mode: bool = False


class PercolakeBatchWriter(DataSourceArrowWriter):
    """One batch write job: tasks write Parquet into the job folder, ``commit`` is one version."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        plan = self.plan
        if plan.check_session_overwrite_mode and _session_overwrite_mode() == "dynamic":
            # Before any file is written: the job fails, abort() removes the empty job
            # folder and nothing is committed.
            raise dynamic_overwrite_refused(f"the session sets {PARTITION_OVERWRITE_CONF}=dynamic")
        if plan.replayed_version is not None:
            return FilesWritten()
        files = write_batches(
            iterator,
            location=plan.target.location,
            staging=plan.staging,
            columns=plan.target.columns,
            partition_by=plan.target.partition_by,
            tag=task_tag(),
        )
        return FilesWritten(tuple(files))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        plan = self.plan
        if plan.replayed_version is not None:
            log.info(
                "write (%s, %s) to %s already committed as version %d; nothing to do",
                plan.app_id,
                plan.batch_id,
                plan.target.table,
                plan.replayed_version,
            )
            return
        files = files_of(messages)
        # Raises when the store refuses the write: then no commit is sent, and abort
        # removes the job's files.
        filesystem.write_bytes(join(plan.staging, COMMITTING_MARKER), plan.job_id.encode())
        with open_gateway(plan.target.gateway) as catalog:
            try:
                committed = catalog.commit_files(
                    plan.target.table,
                    plan.operation,
                    files,
                    job_id=plan.job_id,
                    job_started_ms=plan.job_started_ms,
                    app_id=plan.app_id,
                    batch_id=plan.batch_id,
                    base_version=plan.base_version,
                )
            except TransactionAbortedError:
                # Definitely not committed: nothing names these files.
                remove_folders([plan.staging])
                raise
            # Any other failure propagates with the files in place: the commit may have
            # landed, and a version naming missing files would be worse than disk use.
        if committed.replayed:
            remove_folders([plan.staging])
            log.info(
                "write to %s lost to its own replay; version %d",
                plan.target.table,
                committed.version,
            )
            return
        log.info(
            "%s committed %s version %d (%d files, job %s)",
            plan.operation.lower(),
            plan.target.table,
            committed.version,
            len(files),
            plan.job_id,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        plan = self.plan
        if plan.replayed_version is not None:
            return
        try:
            committing = filesystem.exists(join(plan.staging, COMMITTING_MARKER))
        except OSError as exc:
            log.warning(
                "job %s of %s aborted; cannot tell whether its commit was sent (%s): "
                "its files stay for vacuum",
                plan.job_id,
                plan.target.table,
                exc,
            )
            return
        if committing:
            # A commit was sent: it may have named these files whatever its outcome
            # looked like here. Say what the log knows; delete nothing either way.
            log.warning(
                "job %s of %s aborted after its commit was sent: %s",
                plan.job_id,
                plan.target.table,
                _job_outcome(plan),
            )
            return
        remove_folders([plan.staging])
        log.info(
            "job %s of %s aborted before its commit; its files are removed",
            plan.job_id,
            plan.target.table,
        )


def _session_overwrite_mode() -> str | None:
    """The writing session's ``spark.sql.sources.partitionOverwriteMode``, in a task.

    Spark hands a Python data source none of the session's settings, and its
    ``mode("overwrite")`` on a Python source always replaces the whole table, whatever
    that setting says. But Spark SQL propagates the session's explicitly set ``spark.*``
    settings to every task of a query as local properties (``SQLExecution``
    ``withSQLConfPropagated``), so a write task can read it: the first place where the
    source can see what the user asked for.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return None
    value = ctx.getLocalProperty(PARTITION_OVERWRITE_CONF)
    return None if value is None else value.strip().lower()


def _job_outcome(plan: WritePlan) -> str:
    try:
        with open_gateway(plan.target.gateway) as catalog:
            for entry in catalog.history(plan.target.table):
                if entry.record.job_id == plan.job_id:
                    return f"it committed version {entry.record.version}"
    except Exception as exc:  # the gateway is down, say: the files stay either way
        return f"its outcome is unknown ({exc!r}); the files stay for vacuum"
    return "no version names it yet; the files stay for vacuum"
