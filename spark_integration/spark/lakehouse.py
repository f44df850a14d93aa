"""``Lakehouse``: Spark tables whose every commit is one percolake transaction."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from spark_integration.engine import Catalog, CommitRequest, DmlResult, HistoryEntry, now_ms
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.errors import LakehouseError, TableExistsError
from spark_integration.engine.locations import join, normalize_location, relative_to
from spark_integration.engine.model import (
    APPEND,
    CATALOG_NAME,
    DELETE,
    OPTIMIZE,
    OVERWRITE,
    TABLE_NAME,
    UPDATE,
    Commit,
    DataFile,
    FileEntry,
    FileStats,
    TableMeta,
)
from spark_integration.engine.read_set import ReadSet
from spark_integration.engine.retention import ExpireResult, Retention
from spark_integration.service.client import RemoteCatalog
from spark_integration.spark import changes as change_feed
from spark_integration.spark import dml, filesystem, merge, replace, schema_change, write_job
from spark_integration.spark import optimize as compaction
from spark_integration.spark.hook import (
    STAGING_PREFIX,
    Job,
    job_started_ms,
    new_job,
    write_files,
)
from spark_integration.spark.merge import MergeBuilder
from spark_integration.spark.reads import read_version
from spark_integration.spark.schema import check_dataframe_schema, check_table_schema, parse_schema
from spark_integration.spark.vacuum_sweep import vacuum_table
from spark_integration.spark.write_job import remove_staging as _remove_staging
from txn import Manager
from txn.errors import TransactionAbortedError
from txn.remote import RemoteTransactionManager

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

log = logging.getLogger(__name__)


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"table name must be str, got {type(name).__name__}")
    if not TABLE_NAME.fullmatch(name):
        raise ValueError(
            f"invalid table name {name!r}: expected 1-128 characters from [A-Za-z0-9_.-], "
            "not starting with '.' or '-'"
        )
    return name


def _check_batch(app_id: object, batch_id: object) -> tuple[str | None, int | str | None]:
    if app_id is None and batch_id is None:
        return None, None
    if app_id is None or batch_id is None:
        raise ValueError("app_id and batch_id go together: pass both or neither")
    if not isinstance(app_id, str):
        raise TypeError(f"app_id must be str, got {type(app_id).__name__}")
    if not app_id:
        raise ValueError("app_id must not be empty")
    if isinstance(batch_id, bool) or not isinstance(batch_id, int | str):
        raise TypeError(f"batch_id must be int or str, got {type(batch_id).__name__}")
    if isinstance(batch_id, int) and batch_id < 0:
        raise ValueError(f"batch_id must not be negative, got {batch_id}")
    if isinstance(batch_id, str) and not batch_id:
        raise ValueError("batch_id must not be empty")
    return app_id, batch_id


def _check_version(version: object) -> int | None:
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"version must be int, got {type(version).__name__}")
    if version < 0:
        raise ValueError(f"version must not be negative, got {version}")
    return version


def _check_options(tm: object, warehouse: object, catalog: object, commit_timeout_s: object) -> str:
    """``Lakehouse``'s arguments, checked; returns the warehouse's normalised location."""
    if not isinstance(tm, Manager):
        raise TypeError(f"tm must be a transaction manager (txn.Manager), got {type(tm).__name__}")
    if not isinstance(warehouse, str | os.PathLike):
        raise TypeError(f"warehouse must be a path or an s3:// URL, got {type(warehouse).__name__}")
    location = normalize_location(os.fspath(warehouse))
    if not isinstance(catalog, str) or not CATALOG_NAME.fullmatch(catalog):
        raise ValueError(f"invalid catalog name {catalog!r}: expected [A-Za-z0-9_-]{{1,64}}")
    if isinstance(commit_timeout_s, bool) or not isinstance(commit_timeout_s, int | float):
        raise TypeError("commit_timeout_s must be a number")
    if not commit_timeout_s > 0:
        raise ValueError(f"commit_timeout_s must be positive, got {commit_timeout_s}")
    return location


def _check_retain_seconds(retain_seconds: object) -> float:
    if isinstance(retain_seconds, bool) or not isinstance(retain_seconds, int | float):
        raise TypeError(f"retain_seconds must be a number, got {type(retain_seconds).__name__}")
    if not math.isfinite(retain_seconds) or retain_seconds < 0:
        raise ValueError(f"retain_seconds must be finite and >= 0, got {retain_seconds}")
    return float(retain_seconds)


def _check_dataframe(df: object) -> DataFrame:
    if not isinstance(df, DataFrame):
        raise TypeError(f"expected a pyspark DataFrame, got {type(df).__name__}")
    if df.isStreaming:
        raise TypeError(
            "a streaming DataFrame cannot be written directly; use foreachBatch and pass "
            "the batch id as batch_id (with an app_id) so that replays are idempotent"
        )
    return df


class Lakehouse:
    """Lakehouse tables: Parquet data in ``warehouse``, metadata in percolake.

    ``tm`` is any transaction manager, embedded or remote. Table metadata lives in
    percolake tables named ``<catalog>.*``, so several catalogs can share a store.
    A table's files live under ``<warehouse>/<name>/``. Safe to share between threads.

    ``warehouse`` is an absolute local path or ``s3://bucket/prefix`` (``s3a://`` is
    taken as the same), reached with the standard AWS settings; a bad URL, a missing
    bucket or refused credentials fail here, before anything is committed. Writes
    put each file once at its final path from the Spark tasks (see ``hook``); reads
    of an ``s3://`` table need a session with :func:`~spark_integration.s3a_conf`'s
    settings (``local_session`` has them).

    ``commit_timeout_s`` bounds how long a commit keeps retrying at a busy
    table's head before it gives up with ``ConcurrentModificationError``.

    With a remote manager the catalog runs in the gateway (its ``LakehouseService``):
    each commit is one call, group-committed there with the other appends to the
    table. ``gateway_catalog=False`` runs it here instead, over the manager's
    transactions (for a gateway without the service, and for tests that inject
    faults into the catalog's own transactions).
    """

    def __init__(
        self,
        tm: Manager,
        warehouse: str | os.PathLike[str],
        *,
        catalog: str = "lakehouse",
        commit_timeout_s: float = 300.0,
        gateway_catalog: bool = True,
    ) -> None:
        location = _check_options(tm, warehouse, catalog, commit_timeout_s)
        # A missing bucket or refused credentials fail here, before any commit.
        filesystem.check_reachable(location)
        self._tm = tm
        self._warehouse = location
        #: Fault injection for tests, shared with the catalog's commit path.
        self.failpoints = fp.FailPoints()
        self._catalog: Catalog | RemoteCatalog
        if isinstance(tm, RemoteTransactionManager) and gateway_catalog:
            self._catalog = RemoteCatalog(
                tm, catalog, commit_timeout_s=float(commit_timeout_s), failpoints=self.failpoints
            )
        else:
            self._catalog = Catalog(
                tm, catalog, commit_timeout_s=float(commit_timeout_s), failpoints=self.failpoints
            )

    @property
    def warehouse(self) -> str:
        return self._warehouse

    @property
    def catalog(self) -> str:
        return self._catalog.layout.catalog

    def __repr__(self) -> str:
        return f"<Lakehouse catalog={self.catalog!r} warehouse={self._warehouse!r}>"

    # --- tables ----------------------------------------------------------------------

    def create_table(
        self,
        name: str,
        schema: StructType | str,
        partition_by: Sequence[str] | str = (),
        *,
        retention: Retention | None = None,
    ) -> None:
        """Create an empty table at version 0.

        ``schema`` is a ``StructType`` or a DDL string (``"id BIGINT, day DATE"``,
        parsed by the active Spark session). Raises :class:`TableExistsError` when
        the name is taken or its location holds files other than a dropped table's
        (which this table's vacuum then removes). ``retention``: see
        :meth:`expire` (``None``: 30 days of log, 7 days of batch marks).
        """
        _create_table(self._catalog, self._warehouse, name, schema, partition_by, retention)

    def drop_table(self, name: str) -> None:
        """Drop the table; the name is free again; its files go with :meth:`vacuum` of the name."""
        schema_change.drop_table(self._catalog, _check_name(name))

    def rename_table(self, old: str, new: str) -> None:
        """Rename atomically; refuses a taken ``new``; the files stay where they are."""
        schema_change.rename_table(self._catalog, _check_name(old), _check_name(new))

    def list_tables(self) -> list[str]:
        return self._catalog.list_tables()

    def schema(self, name: str) -> StructType:
        meta = self._catalog.prepare(_check_name(name)).meta
        return StructType.fromJson(json.loads(meta.schema_json))

    def add_columns(self, name: str, columns: str | StructType) -> int:
        """Add nullable columns (Spark DDL ``"c1 INT, c2 STRING"``) as a new version."""
        return schema_change.add_columns(self._catalog, _check_name(name), columns)

    def version(self, name: str) -> int:
        """The table's latest version."""
        return self._catalog.prepare(_check_name(name)).head.version

    # --- writes ----------------------------------------------------------------------

    def append(
        self,
        name: str,
        df: DataFrame,
        app_id: str | None = None,
        batch_id: int | str | None = None,
        *,
        merge_schema: bool = False,
    ) -> int:
        """Add the DataFrame's rows as a new version; returns that version.

        Concurrent appends never fail each other: they retry at the table's head.
        A repeated ``(app_id, batch_id)`` returns its first version and adds nothing.
        ``merge_schema`` adds the DataFrame's new columns and widens (``schema_change``).
        """
        return self._write(APPEND, name, df, app_id, batch_id, (merge_schema, False))

    def overwrite(
        self,
        name: str,
        df: DataFrame,
        app_id: str | None = None,
        batch_id: int | str | None = None,
        *,
        replace_where: str | None = None,
        dynamic_partitions: bool | None = None,
        overwrite_schema: bool = False,
    ) -> int:
        """Replace every row with the DataFrame's, atomically; returns the new version.

        Raises :class:`ConcurrentModificationError` (nothing committed) if another
        commit landed while this job ran: replacing rows it never saw would lose them.
        ``replace_where`` (Spark SQL) replaces only the rows it matches, and
        ``dynamic_partitions`` (``None``: the session's partitionOverwriteMode) only
        the partitions written, each beside concurrent commits elsewhere (``replace``).
        ``overwrite_schema``: the DataFrame's schema becomes the table's.
        """
        mode = replace.mode_of(_check_dataframe(df), replace_where, dynamic_partitions)
        if schema_change.whole_table(mode, overwrite_schema):
            return self._write(OVERWRITE, name, df, app_id, batch_id, (False, overwrite_schema))
        replace.check_no_batch(app_id, batch_id)
        return replace.overwrite(self._catalog, _check_name(name), df, replace_where)

    def _write(
        self,
        operation: str,
        name: str,
        df: DataFrame,
        app_id: str | None,
        batch_id: int | str | None,
        evolve: tuple[bool, bool] = (False, False),
    ) -> int:
        _check_name(name)
        _check_dataframe(df)
        app_id, batch_id = _check_batch(app_id, batch_id)

        def write(job: Job, schema: StructType, partition_by: tuple[str, ...]) -> list[FileEntry]:
            rows = schema_change.conform(df, schema) if evolve[0] else df
            return write_files(rows, schema, partition_by, job)

        return self._run_job(operation, name, df.schema, write, app_id, batch_id, evolve)

    def _run_job(
        self,
        operation: str,
        name: str,
        source_schema: StructType,
        write: write_job.Writer,
        app_id: str | None,
        batch_id: int | str | None,
        evolve: tuple[bool, bool] = (False, False),
    ) -> int:
        """The commit hook (:func:`~spark_integration.spark.write_job.run_job`)."""
        job_args = (operation, name, source_schema, write, app_id, batch_id, evolve)
        return write_job.run_job(self._catalog, self.failpoints, *job_args)

    def append_files(
        self,
        name: str,
        files: Sequence[DataFile],
        *,
        app_id: str | None = None,
        batch_id: int | str | None = None,
        written_since_ms: int | None = None,
    ) -> int:
        """Commit Parquet files that are already in place, as one appended version.

        For writers other than Spark (and for benchmarks). Every path must lie in a
        job folder ``<location>/_lh_job=<id>/`` with the table's partition folders
        below it; sizes, counts and partition values are taken as given.
        ``written_since_ms`` is when the oldest file was written; a vacuum with a
        later cutoff may have removed it, and the commit then fails. By default it
        is what vacuum goes by: the start time in the oldest job folder's name (as
        :func:`~spark_integration.spark.hook.new_job` names them), or for folders whose
        name carries none, the oldest file's mtime. The files are never deleted
        here, whatever happens: they are the caller's until a version names them.
        """
        key = _check_batch(app_id, batch_id)
        return _append_files(self._catalog, _check_name(name), files, key, written_since_ms)

    def rewrite_files(
        self,
        name: str,
        read_version: int,
        removed: Sequence[str],
        added: Sequence[DataFile],
        *,
        operation: str = DELETE,
        predicate: str | None = None,
    ) -> int:
        """Commit a copy-on-write rewrite made without Spark, as ``delete`` commits its own.

        ``removed``: paths (as :meth:`files` gives them) of ``read_version`` whose rows
        the caller read; ``added``: the files it wrote from them, placed as for
        :meth:`append_files`. ``operation``: ``DELETE``, ``UPDATE`` or ``OPTIMIZE`` (no
        row changed). ``predicate`` (Spark SQL) covers every row the rewrite changed
        (``None``: any row), for the conflict check. Returns the version committed;
        on a conflict ``ConcurrentModificationError``, nothing committed. The files
        stay the caller's until a version names them. With no change files, the change
        feed gives its removed files' rows as deleted and its added ones' as inserted.
        """
        args = (read_version, removed, added, operation, predicate)
        return _rewrite_files(self._catalog, _check_name(name), *args)

    # --- row-level changes (``dml``: copy-on-write, checked against what they read) ------

    def delete(
        self, name: str, predicate: str | None = None, *, spark: SparkSession | None = None
    ) -> DmlResult:
        """Delete the rows where ``predicate`` (Spark SQL; ``None``: all) holds."""
        return dml.delete(self._catalog, _check_name(name), predicate, spark)

    def update(
        self,
        name: str,
        updates: dict[str, str],
        predicate: str | None = None,
        *,
        spark: SparkSession | None = None,
    ) -> DmlResult:
        """Set ``updates`` (column: Spark SQL expression) where ``predicate`` holds."""
        return dml.update(self._catalog, _check_name(name), updates, predicate, spark)

    def merge(
        self,
        name: str,
        source_df: DataFrame,
        predicate: str,
        source_alias: str = "source",
        target_alias: str = "target",
        *,
        spark: SparkSession | None = None,
    ) -> MergeBuilder:
        """``MERGE INTO name USING source_df ON predicate``: ``when_*`` clauses, ``execute()``."""
        args = (source_df, predicate, source_alias, target_alias, spark)
        return merge.merge(self._catalog, _check_name(name), *args)

    def optimize(
        self,
        name: str,
        predicate: str | None = None,
        target_file_mb: float = 128,
        *,
        spark: SparkSession | None = None,
    ) -> DmlResult:
        """Compact small files, per partition, into files of up to ``target_file_mb``:
        a commit that changes no row (``optimize``). ``predicate``: partition columns
        only. Nothing to compact: no commit, the current version and 0 files."""
        args = (predicate, target_file_mb, spark)
        return compaction.optimize(self._catalog, _check_name(name), *args)

    def transaction(self) -> LakehouseTransaction:
        """Appends and overwrites of several tables, committed together or not at all.

        ::

            with lh.transaction() as t:
                t.append("orders", orders_df)
                t.append("order_lines", lines_df)
            t.versions  # {"orders": 8, "order_lines": 3}

        Each call writes its table's files right away (a Spark job per call); leaving
        the block commits every table in one transaction. An exception inside the
        block, or a commit that definitely failed, commits nothing and removes the
        files written. A table can be written once per transaction.
        """
        return LakehouseTransaction(self)

    # --- reads -----------------------------------------------------------------------

    def files(self, name: str, version: int | None = None) -> list[DataFile]:
        """The data files of the latest version, or of ``version``, in commit order."""
        _check_name(name)
        _check_version(version)
        location = self._catalog.meta(name).location
        return self._catalog.files(name, version, functools.partial(_data_file, location))[2]

    def version_at(self, name: str, timestamp: datetime.datetime | str | int) -> int:
        """The version that was the table's latest at ``timestamp`` (time travel).

        ``timestamp``: a ``datetime`` (naive means UTC), an ISO-8601 string (likewise),
        or milliseconds since the epoch. Raises :class:`VersionNotFoundError` for a
        time before the table was created or in the future. Once answered for a
        time, the answer never changes (see ``Catalog.version_at``: answering with
        the latest version raises the head's ``last_ms``, a small write).
        """
        return self._catalog.version_at(_check_name(name), _timestamp_ms(timestamp))

    def read(
        self,
        spark: SparkSession | ConnectSession,
        name: str,
        version: int | None = None,
        timestamp: datetime.datetime | str | int | None = None,
    ) -> DataFrame:
        """The rows of the latest version, or exactly those of ``version`` or of the
        version that was the latest at ``timestamp`` (see :meth:`version_at`).

        ``spark`` may be a classic session or a Spark Connect one; the DataFrame is
        of that session's kind. An old version reads with the schema it had."""
        if not _is_spark_session(spark):
            raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
        return _read(self._catalog, spark, _check_name(name), version, timestamp)

    def history(self, name: str) -> list[Commit]:
        """Every version, oldest first."""
        meta = self._catalog.meta(_check_name(name))
        return [_public_commit(meta, h) for h in self._catalog.history(name)]

    def changes(
        self,
        spark: SparkSession | ConnectSession,
        name: str,
        starting_version: int,
        ending_version: int | None = None,
    ) -> DataFrame:
        """The change data feed of versions ``starting_version`` to ``ending_version``
        (``None``: the latest): the rows each inserted, deleted or updated, with Delta's
        ``_change_type``, ``_commit_version`` and ``_commit_timestamp`` (``changes``)."""
        if not _is_spark_session(spark):
            raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
        args = (starting_version, ending_version)
        return change_feed.changes(self._catalog, spark, _check_name(name), *args)

    # --- maintenance -----------------------------------------------------------------

    def retention(self, name: str) -> Retention:
        return self._catalog.retention(_check_name(name))

    def set_retention(self, name: str, retention: Retention) -> None:
        """Change the table's retention; the next expiry applies it (no new version)."""
        self._catalog.set_retention(_check_name(name), retention)

    def expire(self, name: str) -> ExpireResult:
        """Expire what the table's retention no longer keeps (``engine.retention``).

        Versions replaced longer than ``log_retention_s`` ago stop being readable
        (:class:`VersionNotFoundError` says they expired) and leave history; their log
        and file records that no readable version needs are deleted. Batch marks of
        versions older than ``mark_retention_s`` are deleted: **a replay of such a
        batch id commits again**, as a new version. Runs by itself after every
        checkpoint (in the gateway for commits made through it); this runs it now.
        """
        return self._catalog.expire(_check_name(name), now_ms())

    def vacuum(self, name: str, retain_seconds: float) -> list[str]:
        """Remove files that no version inside the retention can read; return their paths.

        A version is inside the retention while it is the latest or was replaced
        less than ``retain_seconds`` ago. Files of failed jobs go once older than
        that. Versions whose files were removed can no longer be read
        (:class:`VersionNotFoundError`). A job that started before the cutoff and
        commits after this vacuum fails with ``ConcurrentModificationError``. A dropped
        table's files go once ``retain_seconds`` have passed since the drop.
        """
        cutoff_ms = now_ms() - int(_check_retain_seconds(retain_seconds) * 1000)
        return vacuum_table(self._catalog, _check_name(name), cutoff_ms)


class LakehouseTransaction:
    """A multi-table commit under way; see :meth:`Lakehouse.transaction`. One thread."""

    def __init__(self, lh: Lakehouse) -> None:
        self._lh = lh
        self._staged: list[tuple[str, CommitRequest, Job | None]] = []
        self._replayed: dict[str, int] = {}
        self._done = False
        #: Each table's new version (or its replayed one), once committed.
        self.versions: dict[str, int] = {}

    def __enter__(self) -> LakehouseTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done:
            return
        self._done = True
        if exc_type is not None:
            self._remove_all()
            return
        self._commit()

    def _check_open(self, name: str) -> None:
        if self._done:
            raise LakehouseError("this lakehouse transaction has ended; start a new one")
        if name in self._replayed or any(n == name for n, _, _ in self._staged):
            raise ValueError(f"table {name!r} is already written in this transaction")

    def append(
        self, name: str, df: DataFrame, app_id: str | None = None, batch_id: int | str | None = None
    ) -> None:
        """Write the DataFrame's rows as the table's next version, at commit."""
        self._write(APPEND, name, df, app_id, batch_id)

    def overwrite(
        self, name: str, df: DataFrame, app_id: str | None = None, batch_id: int | str | None = None
    ) -> None:
        """Replace every row of the table with the DataFrame's, at commit."""
        self._write(OVERWRITE, name, df, app_id, batch_id)

    def _write(
        self,
        operation: str,
        name: str,
        df: DataFrame,
        app_id: str | None,
        batch_id: int | str | None,
    ) -> None:
        _check_name(name)
        _check_dataframe(df)
        app_id, batch_id = _check_batch(app_id, batch_id)
        self._check_open(name)
        if operation == OVERWRITE and replace.mode_of(df, None, None) == "dynamic":
            raise ValueError(
                f"{replace.PARTITION_OVERWRITE_CONF}=dynamic: a transaction's overwrite would "
                "replace the whole table; use lh.overwrite(name, df) outside it, which "
                "replaces only the partitions written"
            )
        catalog = self._lh._catalog
        prepared = catalog.prepare(name, app_id, batch_id)
        if prepared.replayed_version is not None:
            self._replayed[name] = prepared.replayed_version
            return
        meta = prepared.meta
        schema = StructType.fromJson(json.loads(meta.schema_json))
        check_dataframe_schema(name, schema, df.schema)
        job = new_job(meta.location)
        try:
            files = write_files(df, schema, meta.partition_by, job)
        except BaseException:
            _remove_staging(job.staging)
            raise
        base = prepared.head.version if operation == OVERWRITE else None
        request = CommitRequest(
            operation, tuple(files), job.job_id, job.started_ms, app_id, batch_id, base
        )
        request = dataclasses.replace(request, schema_version=prepared.head.schema_version)
        self._staged.append((name, request, job))

    def append_files(
        self,
        name: str,
        files: Sequence[DataFile],
        *,
        app_id: str | None = None,
        batch_id: int | str | None = None,
    ) -> None:
        """Commit Parquet files already in place (see :meth:`Lakehouse.append_files`).

        They are never deleted here, whatever happens.
        """
        _check_name(name)
        app_id, batch_id = _check_batch(app_id, batch_id)
        self._check_open(name)
        meta = self._lh._catalog.meta(name)
        entries = tuple(_relative_entry(meta, f) for f in files)
        started = _oldest_job_start_ms(meta.location, entries)
        request = CommitRequest(
            APPEND, entries, f"files-{uuid.uuid4().hex[:16]}", started, app_id, batch_id
        )
        self._staged.append((name, request, None))

    def _commit(self) -> None:
        if not self._staged:
            self.versions = dict(self._replayed)
            return
        commits = [(name, request) for name, request, _ in self._staged]
        try:
            done = self._lh._catalog.commit_tables(commits)
        except TransactionAbortedError:
            self._remove_all()  # definitely nothing committed
            raise
        # Any other failure leaves the files: the commit may have landed (see _run_job).
        versions = dict(self._replayed)
        for (name, _, job), committed in zip(self._staged, done, strict=True):
            versions[name] = committed.version
            if committed.replayed and job is not None:
                _remove_staging(job.staging)
        self.versions = versions
        log.info("committed %s in one transaction", versions)

    def _remove_all(self) -> None:
        for _, _, job in self._staged:
            if job is not None:
                _remove_staging(job.staging)


def _create_table(
    catalog: Catalog | RemoteCatalog,
    warehouse: str,
    name: str,
    schema: StructType | str,
    partition_by: Sequence[str] | str,
    retention: Retention | None,
) -> None:
    """``Lakehouse.create_table`` (see there)."""
    _check_name(name)
    columns = (partition_by,) if isinstance(partition_by, str) else tuple(partition_by)
    if not all(isinstance(c, str) for c in columns):
        raise TypeError("partition_by must be column names")
    struct = parse_schema(schema)
    check_table_schema(struct, columns)
    if name in catalog.list_tables():
        raise TableExistsError(f"table {name!r} already exists")
    location = join(warehouse, name)
    # Files there are allowed only as a dropped table's (the catalog checks its record).
    over_dropped = filesystem.holds_files(location)
    meta = TableMeta(name, struct.json(), columns, location, now_ms())
    job_id = f"create-{uuid.uuid4().hex[:16]}"
    catalog.create(meta, job_id=job_id, retention=retention, over_dropped=over_dropped)
    filesystem.make_dirs(location)
    log.info("created table %s at %s", name, location)


def _append_files(
    catalog: Catalog | RemoteCatalog,
    name: str,
    files: Sequence[DataFile],
    key: tuple[str | None, int | str | None],
    written_since_ms: int | None,
) -> int:
    """``Lakehouse.append_files`` after its argument checks; ``key``: (app_id, batch_id)."""
    meta = catalog.meta(name)
    entries = [_relative_entry(meta, f) for f in files]
    if written_since_ms is None:
        written_since_ms = _oldest_job_start_ms(meta.location, entries)
    committed = catalog.commit_files(
        name,
        APPEND,
        entries,
        job_id=f"files-{uuid.uuid4().hex[:16]}",
        job_started_ms=written_since_ms,
        app_id=key[0],
        batch_id=key[1],
    )
    return committed.version


#: The operations :meth:`Lakehouse.rewrite_files` commits.
REWRITE_OPERATIONS = (DELETE, UPDATE, OPTIMIZE)


def _rewrite_files(
    catalog: Catalog | RemoteCatalog,
    name: str,
    read_version: int,
    removed: Sequence[str],
    added: Sequence[DataFile],
    operation: str,
    predicate: str | None,
) -> int:
    """``Lakehouse.rewrite_files`` after its name check: the read set that DML
    commits with (``dml.commit_rewrite``), built from what the caller says it read."""
    if operation not in REWRITE_OPERATIONS:
        raise ValueError(f"operation must be one of {list(REWRITE_OPERATIONS)}, got {operation!r}")
    if _check_version(read_version) is None:
        raise ValueError("read_version is required: the version whose files were read")
    if predicate is not None and not isinstance(predicate, str):
        raise TypeError(f"predicate must be a str or None, got {type(predicate).__name__}")
    if isinstance(removed, str) or not removed:
        raise ValueError("removed must name at least one file (an append removes none)")
    meta, _, live = catalog.files(name, read_version, FileEntry)
    live_paths = {e.path for e in live}
    removes: list[str] = []
    for path in removed:
        rel = relative_to(meta.location, path) if isinstance(path, str) else None
        if rel is None or rel not in live_paths:
            raise ValueError(f"{path!r} is not a file of version {read_version} of table {name!r}")
        removes.append(rel)
    if len(set(removes)) != len(removes):
        raise ValueError("removed names a file more than once")
    entries = [_relative_entry(meta, f) for f in added]
    schema = StructType.fromJson(json.loads(meta.schema_json))
    conditions, _ = dml.conditions_of(predicate, schema, meta.partition_by)
    committed = catalog.commit_files(
        name,
        operation,
        entries,
        job_id=f"rewrite-{uuid.uuid4().hex[:16]}",
        job_started_ms=_oldest_job_start_ms(meta.location, entries),
        read_set=ReadSet(read_version, tuple(removes), conditions),
    )
    return committed.version


def _read(
    catalog: Catalog | RemoteCatalog,
    spark: SparkSession | ConnectSession,
    name: str,
    version: int | None,
    timestamp: datetime.datetime | str | int | None,
) -> DataFrame:
    """``Lakehouse.read`` after its session check."""
    _check_version(version)
    if version is not None and timestamp is not None:
        raise ValueError("pass version or timestamp, not both")
    if timestamp is not None:
        version = catalog.version_at(name, _timestamp_ms(timestamp))
    meta, at, entries = catalog.files(name, version, FileEntry)
    schema = StructType.fromJson(json.loads(meta.schema_at(at)))
    return read_version(spark, schema, meta.partition_by, meta.location, entries)


def _is_spark_session(spark: object) -> bool:
    """A classic session, or a Spark Connect one (a class of its own)."""
    if isinstance(spark, SparkSession):
        return True
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # Connect's dependencies are not installed
        return False
    return isinstance(spark, ConnectSession)


def _timestamp_ms(timestamp: object) -> int:
    """Milliseconds since the epoch of a datetime, an ISO-8601 string or an int."""
    if isinstance(timestamp, bool):
        raise TypeError("timestamp must be a datetime, an ISO-8601 string or epoch ms")
    if isinstance(timestamp, int):
        if timestamp < 0:
            raise ValueError(f"timestamp must not be negative, got {timestamp}")
        return timestamp
    if isinstance(timestamp, str):
        try:
            timestamp = datetime.datetime.fromisoformat(timestamp.strip())
        except ValueError:
            raise ValueError(
                f"timestamp {timestamp!r} is not ISO-8601 (e.g. 2026-11-23T10:15:00Z)"
            ) from None
    if not isinstance(timestamp, datetime.datetime):
        raise TypeError(
            "timestamp must be a datetime, an ISO-8601 string or epoch ms, "
            f"got {type(timestamp).__name__}"
        )
    if timestamp.tzinfo is None:
        timestamp = timestamp.replace(tzinfo=datetime.UTC)
    return int(timestamp.timestamp() * 1000)


def _oldest_job_start_ms(location: str, entries: Sequence[FileEntry]) -> int:
    """When the oldest of the jobs that wrote ``entries`` started, as vacuum judges it.

    Vacuum removes a job folder's unreferenced files once the start time in its name
    is older than the cutoff, and the commit fence compares the very same number
    with the cutoff, so no clock can make the two disagree (see ``vacuum_sweep``). In a
    folder whose name carries no start time vacuum goes by file mtimes instead, so
    the oldest mtime stands in. Files that are not on disk cannot be removed: they
    count as written now, which also covers a commit with no files.
    """
    oldest: int | None = None
    for entry in entries:
        folder = entry.path.split("/", 1)[0]
        started = job_started_ms(folder)
        if started is None:
            started = filesystem.mtime_ms(join(location, entry.path))
            if started is None:
                continue
        oldest = started if oldest is None else min(oldest, started)
    return now_ms() if oldest is None else oldest


def _public_commit(meta: TableMeta, h: HistoryEntry) -> Commit:
    return Commit(
        version=h.record.version,
        commit_ts=h.commit_ts,
        operation=h.record.operation,
        added_files=tuple(_absolute(meta, e) for e in h.added),
        removed_files=tuple(_absolute(meta, e) for e in h.removed),
        app_id=h.record.app_id,
        batch_id=h.record.batch_id,
        timestamp_ms=h.record.timestamp_ms,
    )


def _data_file(
    location: str,
    path: str,
    size: int,
    records: int,
    part: dict[str, str | None],
    stats: FileStats | None,
) -> DataFile:
    """A file of the catalog as users see it: its path joined to the table's location."""
    return DataFile(join(location, path), size, records, part, stats)


def _absolute(meta: TableMeta, entry: FileEntry) -> str:
    return join(meta.location, entry.path)


def _relative_entry(meta: TableMeta, f: DataFile) -> FileEntry:
    if not isinstance(f, DataFile):
        raise TypeError(f"expected DataFile, got {type(f).__name__}")
    rel = relative_to(meta.location, f.path) if isinstance(f.path, str) else None
    parts = rel.split("/") if rel is not None else []
    if len(parts) != len(meta.partition_by) + 2 or not parts[0].startswith(STAGING_PREFIX):
        raise ValueError(
            f"{f.path!r} is not in a job folder of table {meta.name!r}: expected "
            f"{meta.location}/{STAGING_PREFIX}<id>/"
            + "".join(f"{c}=<value>/" for c in meta.partition_by)
            + "<file>.parquet"
        )
    if set(f.partition) != set(meta.partition_by):
        raise ValueError(
            f"{f.path!r}: partition values for {sorted(f.partition)}, "
            f"the table is partitioned by {list(meta.partition_by)}"
        )
    for label, value in (("size_bytes", f.size_bytes), ("record_count", f.record_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{f.path!r}: {label} must be a non-negative int, got {value!r}")
    return FileEntry("/".join(parts), f.size_bytes, f.record_count, dict(f.partition), f.stats)
