"""Batch writes: ``df.write.format("percolake")``, one job folder and one version per job."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from spark_integration.engine.locations import join
from spark_integration.engine.model import REPLACE_WHERE, FileEntry, TableMeta
from spark_integration.engine.read_set import Condition, ReadSet
from spark_integration.spark import filesystem
from spark_integration.spark.datasource.files import write_batches
from spark_integration.spark.datasource.gateway import GatewayCatalog, open_gateway, table_schema
from spark_integration.spark.datasource.options import PARTITION_OVERWRITE_CONF, WriteOptions
from spark_integration.spark.datasource.write_plan import (
    FilesWritten,
    WriteTarget,
    files_of,
    remove_folders,
    task_tag,
)
from spark_integration.spark.dml import conditions_of
from spark_integration.spark.replace import partitions_read_set
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
    #: An overwrite without option partitionOverwriteMode or replaceWhere: its tasks
    #: read the session's setting (see ``_session_overwrite_mode``) and report it.
    check_session_overwrite_mode: bool = False
    #: ``where`` (option replaceWhere) or ``dynamic`` (the write option): what an
    #: overwrite replaces, as a ``REPLACE WHERE`` commit; ``None``: the whole table.
    replace: str | None = None
    #: replaceWhere's conditions: on partition columns only, so exact per file.
    conditions: tuple[Condition, ...] = ()
    #: The head's schema version at planning, and the schema a mergeSchema or
    #: overwriteSchema write sets (``None``: unchanged).
    schema_version: int | None = None
    new_schema_json: str | None = None


class PercolakeBatchWriter(DataSourceArrowWriter):
    """One batch write job: tasks write Parquet into the job folder, ``commit`` is one version."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        plan = self.plan
        mode = _session_overwrite_mode() if plan.check_session_overwrite_mode else None
        if mode == "dynamic" and plan.app_id is not None:
            # Before any file is written: the job fails, abort() removes the empty job
            # folder and nothing is committed.
            raise ValueError(_NO_TXN_WITH_REPLACE)
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
        if plan.replace == "where":
            probe = ReadSet(0, (), plan.conditions)
            outside = [f for f in files if not probe.may_match(f)]
            if outside:
                # The job fails: abort() removes its folder, nothing is committed.
                raise ValueError(
                    f"percolake: option replaceWhere ({probe.describe()}): the DataFrame "
                    f"holds rows outside it, in partition {outside[0].partition}; nothing "
                    "was committed (as Delta, an overwrite by predicate only writes rows "
                    "it would replace)"
                )
        return FilesWritten(tuple(files), overwrite_mode=mode)

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
        replace = plan.replace or _session_replace(plan, messages)
        # Raises when the store refuses the write: then no commit is sent, and abort
        # removes the job's files.
        filesystem.write_bytes(join(plan.staging, COMMITTING_MARKER), plan.job_id.encode())
        with open_gateway(plan.target.gateway) as catalog:
            try:
                if replace is None:
                    committed = catalog.commit_files(
                        plan.target.table,
                        plan.operation,
                        files,
                        job_id=plan.job_id,
                        job_started_ms=plan.job_started_ms,
                        app_id=plan.app_id,
                        batch_id=plan.batch_id,
                        base_version=plan.base_version,
                        schema_version=plan.schema_version,
                        new_schema_json=plan.new_schema_json,
                    )
                else:
                    read_set = _replace_read_set(catalog, plan, replace, files)
                    if not files and not read_set.removes:
                        remove_folders([plan.staging])
                        log.info("overwrite of %s replaces nothing", plan.target.table)
                        return
                    committed = catalog.commit_files(
                        plan.target.table,
                        REPLACE_WHERE,
                        files,
                        job_id=plan.job_id,
                        job_started_ms=plan.job_started_ms,
                        read_set=read_set,
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


_NO_TXN_WITH_REPLACE = (
    "percolake: txnAppId/txnVersion make appends and whole-table overwrites idempotent; "
    "an overwrite by replaceWhere or of dynamic partitions does not take them yet"
)


def replace_mode(opts: WriteOptions, overwrite: bool) -> str | None:
    """What a batch write replaces, from its options: see ``WritePlan.replace``."""
    if not overwrite:
        if opts.replace_where is not None:
            raise ValueError('percolake: option replaceWhere needs mode("overwrite")')
        return None  # partitionOverwriteMode does not concern appends, as in Spark
    replace = "where" if opts.replace_where is not None else None
    if opts.partition_overwrite_mode == "dynamic":
        replace = "dynamic"
    if replace is not None and opts.app_id is not None:
        raise ValueError(_NO_TXN_WITH_REPLACE)
    return replace


def replace_where_conditions(predicate: str, meta: TableMeta) -> tuple[Condition, ...]:
    """Option replaceWhere as conditions, which must decide it exactly from partition
    values: the data source's driver side cannot run Spark to rewrite files."""
    conditions, exact = conditions_of(predicate, table_schema(meta), meta.partition_by)
    if not conditions or not exact:
        raise ValueError(
            f"percolake: option replaceWhere {predicate!r} must be simple conditions on "
            f"the partition columns {list(meta.partition_by)} joined by AND (col = literal, "
            "<, <=, >, >=, IN (...), IS [NOT] NULL); Lakehouse.overwrite(name, df, "
            "replace_where=...) takes any predicate"
        )
    return conditions


def _session_replace(plan: WritePlan, messages: list[WriterCommitMessage | None]) -> str | None:
    """``dynamic`` when the tasks found the session asking for it (see ``write``)."""
    if not plan.check_session_overwrite_mode:
        return None
    reports = [m for m in messages if isinstance(m, FilesWritten)]
    if not reports:
        # An empty DataFrame may run no task at all. Replacing the whole table could
        # wipe it when the session asked for dynamic (which replaces nothing here).
        raise ValueError(
            f"percolake: an overwrite with no rows ran no task, so the session's "
            f"{PARTITION_OVERWRITE_CONF} could not be read and it cannot tell what to "
            "replace; nothing was committed. Give option partitionOverwriteMode: static "
            "empties the table, dynamic replaces nothing"
        )
    return "dynamic" if any(m.overwrite_mode == "dynamic" for m in reports) else None


def _replace_read_set(
    catalog: GatewayCatalog, plan: WritePlan, replace: str, files: list[FileEntry]
) -> ReadSet:
    """The read set of a ``REPLACE WHERE`` commit of ``files`` (see ``spark.replace``)."""
    base = plan.base_version
    assert base is not None  # an overwrite's plan always reads one
    meta, _, snapshot = catalog.files(plan.target.table, base, FileEntry)
    if replace == "dynamic":
        if not meta.partition_by:  # as in Spark: dynamic on an unpartitioned table is static
            return ReadSet(base, tuple(e.path for e in snapshot))
        return partitions_read_set(base, snapshot, files, table_schema(meta), meta.partition_by)
    probe = ReadSet(base, (), plan.conditions)
    return ReadSet(base, tuple(e.path for e in snapshot if probe.may_match(e)), plan.conditions)


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
