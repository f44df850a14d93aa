"""Streaming writes: micro-batch ``b`` of a query commits once, marked ``(app_id, b)``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from spark_integration.engine import now_ms
from spark_integration.engine.model import OVERWRITE
from spark_integration.spark.datasource.files import write_batches
from spark_integration.spark.datasource.gateway import open_gateway
from spark_integration.spark.datasource.write_plan import (
    FilesWritten,
    WriteTarget,
    files_of,
    remove_folders,
    task_tag,
)
from spark_integration.spark.hook import new_job
from txn.errors import TransactionAbortedError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamPlan:
    target: WriteTarget
    operation: str
    app_id: str


class PercolakeStreamWriter(DataSourceStreamArrowWriter):
    """A streaming sink: micro-batch ``b`` commits once, marked ``(app_id, b)``.

    Each task writes into a job folder of its own (the micro-batch is not known on
    executors); the batch's version names the files of all of them.
    """

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        target = self.plan.target
        job = new_job(target.location)
        files = write_batches(
            iterator,
            location=target.location,
            staging=str(job.staging),
            columns=target.columns,
            partition_by=target.partition_by,
            tag=task_tag(),
        )
        return FilesWritten(tuple(files), str(job.staging), job.started_ms)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        plan, target = self.plan, self.plan.target
        written = [m for m in messages if isinstance(m, FilesWritten)]
        folders = [m.folder for m in written if m.folder is not None]
        started = [m.started_ms for m in written if m.started_ms is not None]
        files = files_of(messages)
        with open_gateway(target.gateway) as catalog:
            prepared = catalog.prepare(target.table, plan.app_id, batchId)
            if prepared.replayed_version is not None:
                # The batch committed before a restart: this run's files are nobody's.
                remove_folders(folders)
                log.info(
                    "micro-batch %d of %s to %s already committed as version %d",
                    batchId,
                    plan.app_id,
                    target.table,
                    prepared.replayed_version,
                )
                return
            try:
                committed = catalog.commit_files(
                    target.table,
                    plan.operation,
                    files,
                    job_id=f"stream-{uuid.uuid4().hex[:16]}",
                    job_started_ms=min(started, default=now_ms()),
                    app_id=plan.app_id,
                    batch_id=batchId,
                    base_version=prepared.head.version if plan.operation == OVERWRITE else None,
                )
            except TransactionAbortedError:
                remove_folders(folders)
                raise
        if committed.replayed:
            remove_folders(folders)
        log.info(
            "micro-batch %d of %s: %s version %d (%d files)",
            batchId,
            plan.app_id,
            target.table,
            committed.version,
            len(files),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The commit may have been sent before this abort: the files stay for vacuum,
        # which removes them once no version names them.
        log.warning(
            "micro-batch %d of %s to %s aborted; its files stay for vacuum",
            batchId,
            self.plan.app_id,
            self.plan.target.table,
        )
