"""``format("percolake")``: lakehouse tables as a Spark data source (Python Data Source API).

::

    df.write.format("percolake").mode("append").option("gateway", gw).save("events")
    spark.read.format("percolake").option("gateway", gw).option("versionAsOf", 3).load("events")
    sdf.writeStream.format("percolake").option("gateway", gw) \\
        .option("checkpointLocation", ckpt).start("events")

Where each step runs: Spark calls the data source's planning methods (``schema``,
``reader``, ``writer``, ``streamWriter``) and the writers' ``commit``/``abort`` in
Python worker processes on the driver's machine, and ``write``/``read`` in tasks on
executors. Every object that crosses between them is pickled, so plans here are
plain values; each driver-side step opens its own connection to the gateway.

- **Writes.** Planning checks the options and the DataFrame's schema against the
  table (creating it first with ``createIfMissing``), reads the base version an
  overwrite replaces and whether an idempotent write (``txnAppId``/``txnVersion``)
  already committed, and names a job folder. Tasks write Parquet with pyarrow into
  it; ``commit`` makes the files one version with one call to the gateway's
  lakehouse service. ``abort`` removes the folder only when no commit was ever
  sent for the job (a commit whose outcome is unknown may have named its files:
  those stay, for ``vacuum`` to remove if no version names them). Partition values are
  written as Spark writes them (NULL and ``''`` both the default partition). An
  overwrite replaces the whole table; one asked to be dynamic (the session's
  ``spark.sql.sources.partitionOverwriteMode`` or the write option) is refused.
- **Reads.** The version is pinned when the DataFrame is defined (``load``): the
  latest, ``versionAsOf``, or the latest committed at or before ``timestampAsOf``.
  Planning lists that version's files once and spreads them over tasks.
- **Streaming writes.** Micro-batch ``b`` of a query commits with the idempotency
  mark ``(app, b)``, ``app`` being ``txnAppId`` or the query id Spark keeps in the
  checkpoint: a batch replayed after a restart adds nothing. Complete mode is an
  overwrite per batch.
- **Streaming reads.** Committed versions in order, as Delta does: without
  ``startingVersion`` the latest version's snapshot first, then each later version's
  added files; ``startingVersion=n`` the files added by versions ``n, n+1, ...``;
  ``startingVersion=latest`` only versions committed after the query starts. An
  offset is ``{version, index, snapshot}``, the next file to read, so
  ``maxFilesPerTrigger`` can end a micro-batch inside a version. A version that
  removed files (an overwrite) fails the query unless ``skipChangeCommits``; a
  version vacuum removed files of fails it naming the version.

- **Filters.** With ``spark.sql.python.filterPushdown.enabled`` the reader takes the
  query's filters (``pushFilters``): filters on partition columns drop files by their
  partition values and are not applied again; filters on data columns skip files whose
  column statistics prove no row matches and stay for Spark (``pruning``). PySpark
  fails every read of a reader with ``pushFilters`` when that setting is off, and a
  source cannot read the session's settings, so that reader is handed only to the
  worker Spark runs when it is on (``_planning_with_pushdown``).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_integration.engine.catalog import now_ms
from spark_integration.engine.errors import (
    ChangeCommitError,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
    VersionVacuumedError,
)
from spark_integration.engine.model import APPEND, OVERWRITE, FileEntry, Head, TableMeta
from spark_integration.engine.retention import describe_s
from spark_integration.service.client import RemoteCatalog
from spark_integration.spark.datasource.files import (
    FileToRead,
    read_files,
    split_files,
    write_batches,
)
from spark_integration.spark.datasource.options import (
    PARTITION_OVERWRITE_CONF,
    STREAM_READ_OPTIONS,
    ReadOptions,
    StreamReadOptions,
    dynamic_overwrite_refused,
    query_id_of_checkpoint,
    read_options,
    stream_read_options,
    stream_write_options,
    write_options,
)
from spark_integration.spark.datasource.pruning import Candidate, prune
from spark_integration.spark.hook import new_job
from spark_integration.spark.schema import check_dataframe_schema
from spark_integration.spark.session import reach_every_session, workers_run_this_python
from txn import TransactionManager
from txn.errors import TransactionAbortedError
from txn.remote import RemoteTransactionManager
from wire.rpc import resolve_token

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

log = logging.getLogger(__name__)

#: The catalog ``Lakehouse`` uses by default: tables written here are its tables.
CATALOG = "lakehouse"
#: Written into a job folder just before its commit is sent: from then on the files
#: may be named by a version, and ``abort`` leaves them alone.
COMMITTING_MARKER = "_committing"
#: Read tasks of about this many bytes of Parquet each, at least two while there are files.
READ_SPLIT_BYTES = 128 << 20
READ_MIN_SPLITS = 2


class _Catalog(RemoteCatalog):
    """The catalog with the manager it runs on (``Lakehouse`` creates tables on it)."""

    def __init__(self, tm: RemoteTransactionManager) -> None:
        super().__init__(tm, CATALOG)
        self.manager = tm


@contextmanager
def _gateway(address: str) -> Iterator[_Catalog]:
    """The lakehouse catalog through the gateway at ``address``; token from ``$PERCOLAKE_TOKEN``."""
    tm = TransactionManager.remote(address, token=resolve_token())
    try:
        yield _Catalog(tm)
    finally:
        tm.close()


def _schema_of(meta: TableMeta) -> StructType:
    return StructType.fromJson(json.loads(meta.schema_json))


def _task_tag() -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return uuid.uuid4().hex[:8]
    return f"{ctx.partitionId():05d}-{ctx.attemptNumber()}"


def _remove(folders: Sequence[str]) -> None:
    # Best effort: a straggling task may still write here; vacuum removes what is left.
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


# --- writes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    """Where and how tasks write: the table's folder, column order and partitioning."""

    table: str
    gateway: str
    location: str
    columns: tuple[str, ...]
    partition_by: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _WritePlan:
    target: _Target
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


@dataclass(frozen=True)
class FilesWritten(WriterCommitMessage):
    """What one task wrote: its files (paths relative to the table location)."""

    files: tuple[FileEntry, ...] = ()
    #: The task's own job folder (streaming writes) and when it started.
    folder: str | None = None
    started_ms: int | None = None


def _files_of(messages: Sequence[WriterCommitMessage | None]) -> list[FileEntry]:
    out: list[FileEntry] = []
    for message in messages:
        if isinstance(message, FilesWritten):
            out.extend(message.files)
    return out


def _prepare_table(catalog: _Catalog, opts: Any, schema: StructType) -> TableMeta:
    """The table to write, created from the DataFrame's schema when asked and missing.

    ``opts`` is a write or streaming write option set. Checks the DataFrame's schema
    and the ``partitionColumns`` option against the table's.
    """
    try:
        meta = catalog.meta(opts.table)
    except TableNotFoundError:
        if not opts.create_if_missing:
            raise TableNotFoundError(
                f"percolake: table {opts.table!r} does not exist; create it, or pass "
                "option createIfMissing=true (with warehouse and, if wanted, partitionColumns)"
            ) from None
        meta = _create(catalog, opts, schema)
    if opts.partition_by is not None and tuple(opts.partition_by) != meta.partition_by:
        raise ValueError(
            f"percolake: option partitionColumns {list(opts.partition_by)} does not match "
            f"table {opts.table!r}, which is partitioned by {list(meta.partition_by)}"
        )
    check_dataframe_schema(opts.table, _schema_of(meta), schema)
    return meta


def _create(catalog: _Catalog, opts: Any, schema: StructType) -> TableMeta:
    from spark_integration.spark.lakehouse import Lakehouse

    # The catalog's own manager: Lakehouse checks names, schema and location as usual.
    lh = Lakehouse(catalog.manager, opts.warehouse, catalog=CATALOG)
    try:
        lh.create_table(opts.table, schema, tuple(opts.partition_by or ()))
    except TableExistsError:
        log.info("table %s was created concurrently; writing to it", opts.table)
    return catalog.prepare(opts.table).meta


def _target(opts: Any, meta: TableMeta) -> _Target:
    return _Target(
        opts.table,
        opts.gateway,
        meta.location,
        tuple(_schema_of(meta).fieldNames()),
        meta.partition_by,
    )


class PercolakeBatchWriter(DataSourceArrowWriter):
    """One batch write job: tasks write Parquet into the job folder, ``commit`` is one version."""

    def __init__(self, plan: _WritePlan) -> None:
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
            tag=_task_tag(),
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
        files = _files_of(messages)
        os.makedirs(plan.staging, exist_ok=True)
        with open(os.path.join(plan.staging, COMMITTING_MARKER), "w", encoding="utf-8") as f:
            f.write(plan.job_id)
        with _gateway(plan.target.gateway) as catalog:
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
                _remove([plan.staging])
                raise
            # Any other failure propagates with the files in place: the commit may have
            # landed, and a version naming missing files would be worse than disk use.
        if committed.replayed:
            _remove([plan.staging])
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
        if os.path.exists(os.path.join(plan.staging, COMMITTING_MARKER)):
            # A commit was sent: it may have named these files whatever its outcome
            # looked like here. Say what the log knows; delete nothing either way.
            log.warning(
                "job %s of %s aborted after its commit was sent: %s",
                plan.job_id,
                plan.target.table,
                _job_outcome(plan),
            )
            return
        _remove([plan.staging])
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


def _job_outcome(plan: _WritePlan) -> str:
    try:
        with _gateway(plan.target.gateway) as catalog:
            for entry in catalog.history(plan.target.table):
                if entry.record.job_id == plan.job_id:
                    return f"it committed version {entry.record.version}"
    except Exception as exc:  # the gateway is down, say: the files stay either way
        return f"its outcome is unknown ({exc!r}); the files stay for vacuum"
    return "no version names it yet; the files stay for vacuum"


@dataclass(frozen=True, slots=True)
class _StreamPlan:
    target: _Target
    operation: str
    app_id: str


class PercolakeStreamWriter(DataSourceStreamArrowWriter):
    """A streaming sink: micro-batch ``b`` commits once, marked ``(app_id, b)``.

    Each task writes into a job folder of its own (the micro-batch is not known on
    executors); the batch's version names the files of all of them.
    """

    def __init__(self, plan: _StreamPlan) -> None:
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
            tag=_task_tag(),
        )
        return FilesWritten(tuple(files), str(job.staging), job.started_ms)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        plan, target = self.plan, self.plan.target
        written = [m for m in messages if isinstance(m, FilesWritten)]
        folders = [m.folder for m in written if m.folder is not None]
        started = [m.started_ms for m in written if m.started_ms is not None]
        files = _files_of(messages)
        with _gateway(target.gateway) as catalog:
            prepared = catalog.prepare(target.table, plan.app_id, batchId)
            if prepared.replayed_version is not None:
                # The batch committed before a restart: this run's files are nobody's.
                _remove(folders)
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
                _remove(folders)
                raise
        if committed.replayed:
            _remove(folders)
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


# --- reads ----------------------------------------------------------------------------


class _Split(InputPartition):
    def __init__(self, files: tuple[FileToRead, ...]) -> None:
        super().__init__(len(files))
        self.files = files


class PercolakeReader(DataSourceReader):
    """A pinned snapshot: the files were listed once, at planning, on the driver."""

    def __init__(
        self,
        table: str,
        schema_json: str,
        partition_by: tuple[str, ...],
        files: list[FileToRead],
    ) -> None:
        self.table = table
        self.schema_json = schema_json
        self.partition_by = partition_by
        self.files = files

    def partitions(self) -> Sequence[InputPartition]:
        groups = split_files(self.files, READ_SPLIT_BYTES, READ_MIN_SPLITS)
        log.info("read of %s: %d files in %d tasks", self.table, len(self.files), len(groups))
        # Spark wants at least one partition; an empty table reads one with no files.
        return [_Split(tuple(group)) for group in groups] or [_Split(())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, _Split)
        schema = StructType.fromJson(json.loads(self.schema_json))
        target = to_arrow_schema(schema, timezone="UTC")
        yield from read_files(partition.files, target, self.partition_by)


class PercolakePushdownReader(PercolakeReader):
    """A snapshot read that drops the files a query's filters rule out (``pushFilters``).

    Filters on partition columns are decided per file and not returned; filters on
    data columns skip files whose column statistics prove no row matches, and go back
    to Spark for the rows of the files kept (see ``pruning``).
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        schema = StructType.fromJson(json.loads(self.schema_json))
        candidates = [Candidate(f.partition, f.record_count, f.stats) for f in self.files]
        pruned = prune(candidates, filters, schema, self.partition_by)
        log.info(
            "read of %s: %d filters pushed, %d of %d files kept, %d filters left to Spark",
            self.table,
            len(filters),
            len(pruned.kept),
            len(self.files),
            len(pruned.remaining),
        )
        self.files = [self.files[i] for i in pruned.kept]
        return pruned.remaining


#: The PySpark worker that plans a read with filter pushdown. Spark runs it instead of
#: its plain read planner only when the session sets
#: ``spark.sql.python.filterPushdown.enabled``; the plain planner fails every read of
#: a reader that implements ``pushFilters``, and a data source cannot read the
#: session's configuration. So the reader with ``pushFilters`` goes only to this worker.
_PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"


def _planning_with_pushdown() -> bool:
    """Whether Spark's filter pushdown worker called this (looked up on the stack).

    A PySpark that renamed the worker only loses the pruning: the plain reader is
    always safe.
    """
    frame = inspect.currentframe()
    while frame is not None:
        spec = frame.f_globals.get("__spec__")
        if _PUSHDOWN_WORKER in (frame.f_globals.get("__name__"), getattr(spec, "name", None)):
            return True
        frame = frame.f_back
    return False


def _resolve_version(catalog: _Catalog, opts: ReadOptions) -> int:
    head = catalog.prepare(opts.table).head
    if opts.version is not None:
        if opts.version > head.version:
            raise VersionNotFoundError(
                f"percolake: table {opts.table!r} has no version {opts.version} "
                f"(latest is {head.version})"
            )
        return opts.version
    if opts.timestamp_ms is None:
        return head.version
    # The gateway binary-searches the log's never-decreasing commit times; a time
    # before the table or in the future raises VersionNotFoundError.
    return catalog.version_at(opts.table, opts.timestamp_ms)


# --- streaming reads ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Position:
    """Where a streaming read stands: the next file is file ``index`` of version ``version``.

    The files of a version are the files it added, or with ``snapshot`` every file
    of the table at that version (the first version of a read without
    ``startingVersion``). Offsets are this as a JSON object; only the position's own
    version can be a snapshot, the versions after it are always read as changes.
    """

    version: int
    index: int
    snapshot: bool

    def offset(self) -> dict[str, Any]:
        return {"version": self.version, "index": self.index, "snapshot": self.snapshot}

    @classmethod
    def of(cls, offset: dict[str, Any]) -> _Position:
        return cls(int(offset["version"]), int(offset["index"]), bool(offset["snapshot"]))


@dataclass(frozen=True, slots=True)
class _StreamFile:
    version: int
    file: FileToRead


class _StreamSplit(InputPartition):
    """The files of one read task, with what a task needs to read them.

    The table's partition columns travel with the split: Spark's read tasks run a
    reader made afresh by ``streamReader`` (never the driver's, which learned them
    from the gateway), so a value kept only on the driver's reader is lost there.
    """

    def __init__(self, files: tuple[_StreamFile, ...], partition_by: tuple[str, ...]) -> None:
        super().__init__(len(files))
        self.files = files
        self.partition_by = partition_by


class PercolakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Committed versions in order, file by file; ``maxFilesPerTrigger`` bounds a micro-batch.

    Versions are immutable once committed, so the files of each are fetched once
    (from the gateway's history, or its file list for a snapshot) and kept.
    """

    def __init__(self, opts: StreamReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema_json = schema.json()
        self.partition_by: tuple[str, ...] = ()
        self.location = ""
        self._changes: dict[int, list[FileToRead]] = {}
        self._snapshots: dict[int, list[FileToRead]] = {}
        #: Versions that removed files, and their operation.
        self._change_commits: dict[int, str] = {}
        #: Versions below the oldest readable one whose added files were all found.
        self._present: set[int] = set()
        #: With ``Trigger.AvailableNow``: the last version this run reads.
        self._until: int | None = None

    # -- driver side ------------------------------------------------------------------

    def _head(self) -> Head:
        with _gateway(self.opts.gateway) as catalog:
            prepared = catalog.prepare(self.opts.table)
        self.partition_by = prepared.meta.partition_by
        self.location = prepared.meta.location
        return prepared.head

    def initialOffset(self) -> dict[str, Any]:
        head = self._head()
        opts = self.opts
        if opts.starting_version is not None:
            if opts.starting_version > head.version + 1:
                raise VersionNotFoundError(
                    f"percolake: startingVersion {opts.starting_version} of table "
                    f"{opts.table!r} is beyond its latest version {head.version}"
                )
            return _Position(opts.starting_version, 0, False).offset()
        if opts.only_new:
            return _Position(head.version + 1, 0, False).offset()
        return _Position(head.version, 0, True).offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._head().version

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_files is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.opts.max_files)

    def _files(self, version: int, snapshot: bool, head: Head) -> list[FileToRead]:
        """The files a read of ``version`` takes (all of its snapshot, or what it added)."""
        cache = self._snapshots if snapshot else self._changes
        outdated = version < head.min_readable_version
        if version not in cache:
            # Below min_readable_version a snapshot is gone: retention expired the
            # version or vacuum removed files (a restart from a checkpoint whose offset
            # is that snapshot); a version's own added files may still all be there (an
            # append that no overwrite replaced), so they are looked for.
            if outdated and snapshot:
                raise self._unreadable_snapshot(version, head)
            self._fetch(version, snapshot, head)
            if version not in cache:
                # History leaves out only what retention expired (every version up
                # to the head has a log record until then): never read it as empty.
                raise self._expired(version)
        if outdated and version not in self._present:
            if not all(os.path.exists(f.path) for f in cache.get(version, [])):
                raise self._vacuumed(version, head)
            self._present.add(version)
        removed_by = self._change_commits.get(version)
        if not snapshot and removed_by is not None and not self.opts.skip_change_commits:
            raise ChangeCommitError(
                f"percolake: version {version} of table {self.opts.table!r} is an "
                f"{removed_by} that removed files; a streaming read takes only versions "
                "that add files. Set option skipChangeCommits=true to skip such versions"
            )
        return cache.get(version, [])

    def _unreadable_snapshot(
        self, version: int, head: Head
    ) -> VersionNotFoundError | VersionVacuumedError:
        """Why the snapshot of ``version``, below the oldest readable version, is gone.

        Retention raised the head's ``min_readable_version`` past it (the version
        expired: history, asked afresh, leaves it out, and its files may well still
        exist), or vacuum's fence did (history still lists it, its files may be gone).
        """
        with _gateway(self.opts.gateway) as catalog:
            listed = any(e.record.version == version for e in catalog.history(self.opts.table))
        return self._vacuumed(version, head) if listed else self._expired(version)

    def _vacuumed(self, version: int, head: Head) -> VersionVacuumedError:
        return VersionVacuumedError(
            f"percolake: version {version} of table {self.opts.table!r} is no longer "
            "readable: vacuum removed its files (the oldest fully readable version is "
            f"{head.min_readable_version}); restart the query with a new checkpoint and a "
            "later startingVersion"
        )

    def _expired(self, version: int) -> VersionNotFoundError:
        with _gateway(self.opts.gateway) as catalog:
            readable = catalog.prepare(self.opts.table).head.min_readable_version
            retention = catalog.retention(self.opts.table)
        return VersionNotFoundError(
            f"percolake: the stream cannot read version {version} of table "
            f"{self.opts.table!r}: it expired under the table's log retention "
            f"({describe_s(retention.log_retention_s)}), which removed its log and file "
            f"records (versions from {readable} on are readable). Restart the query with a "
            f"new checkpoint and startingVersion={readable} or later; to keep versions "
            "for streams that stay down longer, raise the retention (Lakehouse.set_retention)"
        )

    def _fetch(self, version: int, snapshot: bool, head: Head) -> None:
        with _gateway(self.opts.gateway) as catalog:
            if snapshot:
                meta, _, entries = catalog.files(self.opts.table, version, FileEntry)
                self._snapshots[version] = _to_read(meta.location, entries)
                return
            location = catalog.meta(self.opts.table).location
            for entry in catalog.history(self.opts.table):
                record = entry.record
                if record.version in self._changes or record.version > head.version:
                    continue
                if entry.removed:
                    # A skipped change commit reads nothing: its added files repeat
                    # rows the stream has already seen.
                    self._change_commits[record.version] = record.operation
                    self._changes[record.version] = []
                else:
                    self._changes[record.version] = _to_read(location, entry.added)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        head = self._head()
        last = head.version if self._until is None else min(self._until, head.version)
        budget = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        at = _Position.of(start)
        while at.version <= last:
            left = len(self._files(at.version, at.snapshot, head)) - at.index
            if budget is not None and left > budget:
                return _Position(at.version, at.index + budget, at.snapshot).offset()
            at = _Position(at.version + 1, 0, False)
            if budget is not None:
                budget -= left
                if budget == 0:
                    break
        return at.offset()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return _Position(self._head().version + 1, 0, False).offset()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        head = self._head()
        first, stop = _Position.of(start), _Position.of(end)
        picked: list[_StreamFile] = []
        at = first
        while (at.version, at.index) < (stop.version, stop.index):
            files = self._files(at.version, at.snapshot, head)
            upto = stop.index if at.version == stop.version else len(files)
            picked += [_StreamFile(at.version, f) for f in files[at.index : upto]]
            at = _Position(at.version + 1, 0, False)
        by_path = {f.file.path: f for f in picked}
        groups = split_files([f.file for f in picked], READ_SPLIT_BYTES, READ_MIN_SPLITS)
        log.info(
            "stream of %s: versions %d..%d, %d files in %d tasks",
            self.opts.table,
            first.version,
            stop.version,
            len(picked),
            len(groups),
        )
        return [
            _StreamSplit(tuple(by_path[f.path] for f in group), self.partition_by)
            for group in groups
        ]

    def commit(self, end: dict[str, Any]) -> None:
        # Versions before the committed offset are never read again: forget their files.
        done = _Position.of(end).version
        for cache in (self._changes, self._snapshots):
            for version in [v for v in cache if v < done]:
                del cache[version]

    # -- executors ----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, _StreamSplit)
        schema = StructType.fromJson(json.loads(self.schema_json))
        target = to_arrow_schema(schema, timezone="UTC")
        for item in partition.files:
            if not os.path.exists(item.file.path):
                raise VersionVacuumedError(
                    f"percolake: file {item.file.path} of version {item.version} of table "
                    f"{self.opts.table!r} is gone (vacuumed?); the stream cannot read that "
                    "version"
                )
            yield from read_files([item.file], target, partition.partition_by)


def _to_read(location: str, entries: Sequence[FileEntry]) -> list[FileToRead]:
    return [
        FileToRead(os.path.join(location, e.path), e.size_bytes, e.partition, e.record_count)
        for e in entries
    ]


# --- the source -----------------------------------------------------------------------


class PercolakeDataSource(DataSource):
    """The ``percolake`` format. Its options are CONTRACT.md's; the path is the table name."""

    #: The version a read is pinned to, set when the DataFrame is defined (``schema``).
    pinned_version: int | None = None

    @classmethod
    def name(cls) -> str:
        return "percolake"

    def schema(self) -> StructType:
        if any(k.lower() in STREAM_READ_OPTIONS for k in self.options):
            # A streaming read (Spark asks for the schema before it knows which reader):
            # its options are checked here, a batch reader refuses them by name.
            stream_opts = stream_read_options(self.options)
            with _gateway(stream_opts.gateway) as catalog:
                return _schema_of(catalog.meta(stream_opts.table))
        opts = read_options(self.options)
        with _gateway(opts.gateway) as catalog:
            version = _resolve_version(catalog, opts)
            meta = catalog.meta(opts.table)
        self.pinned_version = version
        return _schema_of(meta)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = read_options(self.options)
        with _gateway(opts.gateway) as catalog:
            version = self.pinned_version
            if version is None:  # the user gave a schema: schema() never ran
                version = _resolve_version(catalog, opts)
            meta, _, entries = catalog.files(opts.table, version, FileEntry)
        check_dataframe_schema(opts.table, _schema_of(meta), schema)
        files = [
            FileToRead(
                os.path.join(meta.location, e.path),
                e.size_bytes,
                e.partition,
                e.record_count,
                e.stats,
            )
            for e in entries
        ]
        log.info("read of %s version %d: %d files", opts.table, version, len(files))
        # Spark refuses a reader with pushFilters unless the session enabled Python
        # filter pushdown, and then asks for the reader in a worker of its own.
        kind = PercolakePushdownReader if _planning_with_pushdown() else PercolakeReader
        return kind(opts.table, schema.json(), meta.partition_by, files)

    def streamReader(self, schema: StructType) -> PercolakeStreamReader:
        return PercolakeStreamReader(stream_read_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> PercolakeBatchWriter:
        opts = write_options(self.options)
        if overwrite and opts.partition_overwrite_mode == "dynamic":
            # Refused before the table is created or anything is written.
            raise dynamic_overwrite_refused("option partitionOverwriteMode=dynamic")
        with _gateway(opts.gateway) as catalog:
            meta = _prepare_table(catalog, opts, schema)
            prepared = catalog.prepare(opts.table, opts.app_id, opts.batch_id)
        job = new_job(meta.location)
        plan = _WritePlan(
            target=_target(opts, meta),
            operation=OVERWRITE if overwrite else APPEND,
            job_id=job.job_id,
            job_started_ms=job.started_ms,
            staging=str(job.staging),
            base_version=prepared.head.version if overwrite else None,
            app_id=opts.app_id,
            batch_id=opts.batch_id,
            replayed_version=prepared.replayed_version,
            # The write option, when given, wins over the session's setting (as in Spark).
            check_session_overwrite_mode=overwrite and opts.partition_overwrite_mode is None,
        )
        return PercolakeBatchWriter(plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PercolakeStreamWriter:
        opts = stream_write_options(self.options)
        app_id = opts.app_id
        if app_id is None:
            assert opts.checkpoint is not None, "checked with the options"
            app_id = f"query-{query_id_of_checkpoint(opts.checkpoint)}"
        with _gateway(opts.gateway) as catalog:
            meta = _prepare_table(catalog, opts, schema)
        return PercolakeStreamWriter(
            _StreamPlan(_target(opts, meta), OVERWRITE if overwrite else APPEND, app_id)
        )


def register(spark: SparkSession | ConnectSession) -> None:
    """Register ``format("percolake")`` with ``spark``, a classic or a Spark Connect session.

    An installed percolake is found by name without it (Spark's lookup of
    ``pyspark_*`` modules finds ``pyspark_percolake``, also in a Connect server) when
    the JVM started with ``$PYSPARK_PYTHON`` naming this environment's Python
    (``local_session`` sets it). For a classic session ``register`` also covers what
    that lookup cannot (see ``spark.session``): it makes the workers run this interpreter
    when the user chose none, and makes the source reach the sessions
    ``spark.newSession()`` makes and writes from other threads.
    """
    from pyspark.sql import SparkSession as ClassicSession

    if isinstance(spark, ClassicSession):
        # Before registering: the registration takes its workers' Python from the context.
        workers_run_this_python(spark)
        reach_every_session(PercolakeDataSource)
    spark.dataSource.register(PercolakeDataSource)


__all__ = [
    "ChangeCommitError",
    "FilesWritten",
    "PercolakeBatchWriter",
    "PercolakeDataSource",
    "PercolakePushdownReader",
    "PercolakeReader",
    "PercolakeStreamReader",
    "PercolakeStreamWriter",
    "VersionVacuumedError",
    "register",
]
