"""The gateway's ``LakehouseService``: lakehouse commits next to the store, group-committed.

A lakehouse commit is a read-modify-write of the table's head row. Driven from a
client, every round trip of it (begin, read the head, read the marks, write, commit)
sits inside the window where another commit of the table conflicts, and writers in
different processes keep aborting each other. Here the catalog runs inside the
gateway on its embedded manager, so the window holds no client round trip.

Appends to one table that arrive together are committed in one transaction by the
:class:`GroupCommitter` (``service.group_commit``); this module checks each request
at the edge and turns the catalog's answers into protobuf messages.

The commit's follow-up work (checkpoints, expiry) runs on a background thread after
the reply. The gateway records no commit timestamps: history finds each one in the
transactions table, or in the commit stamp of the log record's version once garbage
collection deleted the entry (``History._find_commit_tss``), so a restarted gateway
after a collection pass shows the same history.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from spark_integration.engine import Catalog, CommitRequest, Retention
from spark_integration.engine.locations import check_relative_file, normalize_location
from spark_integration.engine.model import (
    CATALOG_NAME,
    DML_OPERATIONS,
    OVERWRITE,
    TABLE_NAME,
    FileEntry,
    TableMeta,
)
from spark_integration.engine.read_set import check_read_set
from spark_integration.engine.vacuum_plan import VacuumPlan
from spark_integration.service.convert import (
    OPERATION_NAMES,
    dropped_to_pb,
    entry_from_pb,
    entry_to_pb,
    file_to_pb,
    head_from_pb,
    head_to_pb,
    mark_from_pb,
    mark_to_pb,
    meta_from_pb,
    meta_to_pb,
    read_set_from_pb,
    retention_from_pb,
)
from spark_integration.service.group_commit import GroupCommitter, LakehouseLimits
from txn import TransactionManager
from wire.error_codes import abort_with
from wire.v1 import lakehouse_pb2 as pb
from wire.v1 import lakehouse_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: Files per streamed batch of ListFiles and PlanVacuum; entries per History batch.
STREAM_BATCH = 2_000
MAX_JOB_ID = 256


class LakehouseServicer(pb_grpc.LakehouseServiceServicer):
    """``percolake.v1.LakehouseService`` on the gateway's embedded manager."""

    #: Test builds replace it (see :class:`GroupCommitter`'s hooks).
    committer_class: type[GroupCommitter] = GroupCommitter

    def __init__(
        self,
        manager: TransactionManager,
        limits: LakehouseLimits | None = None,
        *,
        commit_timeout_s: float = 300.0,
    ) -> None:
        self._manager = manager
        self._commit_timeout_s = commit_timeout_s
        self._groups = self.committer_class(limits or LakehouseLimits())
        self._follow_ups = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="percolake-lakehouse-follow-up"
        )
        self._catalogs: dict[str, Catalog] = {}
        self._catalogs_lock = threading.Lock()

    def shutdown(self) -> None:
        """Finish queued follow-up work (commit timestamps, checkpoints)."""
        self._follow_ups.shutdown(wait=True)

    def _catalog(self, name: str) -> Catalog:
        if not CATALOG_NAME.fullmatch(name):
            raise ValueError(f"invalid catalog name {name!r}: expected [A-Za-z0-9_-]{{1,64}}")
        with self._catalogs_lock:
            catalog = self._catalogs.get(name)
            if catalog is None:
                catalog = Catalog(
                    self._manager,
                    name,
                    commit_timeout_s=self._commit_timeout_s,
                    follow_ups=self._follow_ups.submit,
                    commit_ts_of=self._manager.outcome_of,
                )
                self._catalogs[name] = catalog
            return catalog

    # --- tables ----------------------------------------------------------------------

    def CreateTable(
        self, request: pb.CreateTableRequest, context: grpc.ServicerContext
    ) -> pb.CreateTableResponse:
        try:
            catalog = self._catalog(request.catalog)
            meta = _check_meta(request.meta)
            job_id = _check_job_id(request.job_id)
            retention = (
                _check_retention(meta, request.retention) if request.HasField("retention") else None
            )
            commit_ts = catalog.create(
                meta, job_id=job_id, retention=retention, over_dropped=request.over_dropped
            )
            return pb.CreateTableResponse(commit_ts=commit_ts)
        except Exception as exc:
            abort_with(context, exc)

    def GetTable(
        self, request: pb.GetTableRequest, context: grpc.ServicerContext
    ) -> pb.GetTableResponse:
        try:
            catalog = self._catalog(request.catalog)
            name = _check_table(request.table)
            app_id, batch_id = (
                _check_mark(request.mark) if request.HasField("mark") else (None, None)
            )
            prepared = catalog.prepare(name, app_id, batch_id)
            as_of = (
                catalog.version_at(name, request.as_of_ms) if request.HasField("as_of_ms") else None
            )
            return pb.GetTableResponse(
                meta=meta_to_pb(prepared.meta),
                head=head_to_pb(prepared.head),
                replayed_version=prepared.replayed_version,
                version_as_of=as_of,
            )
        except Exception as exc:
            abort_with(context, exc)

    def DropTable(
        self, request: pb.DropTableRequest, context: grpc.ServicerContext
    ) -> pb.DropTableResponse:
        try:
            catalog = self._catalog(request.catalog)
            meta = catalog.drop_table(_check_table(request.table))
            return pb.DropTableResponse(meta=meta_to_pb(meta))
        except Exception as exc:
            abort_with(context, exc)

    def RenameTable(
        self, request: pb.RenameTableRequest, context: grpc.ServicerContext
    ) -> pb.RenameTableResponse:
        try:
            catalog = self._catalog(request.catalog)
            old, new = _check_table(request.table), _check_table(request.new_name)
            catalog.rename_table(old, new)
            return pb.RenameTableResponse()
        except Exception as exc:
            abort_with(context, exc)

    def ListTables(
        self, request: pb.ListTablesRequest, context: grpc.ServicerContext
    ) -> pb.ListTablesResponse:
        try:
            return pb.ListTablesResponse(tables=self._catalog(request.catalog).list_tables())
        except Exception as exc:
            abort_with(context, exc)

    # --- commits ---------------------------------------------------------------------

    def CommitFiles(
        self, request: pb.CommitFilesRequest, context: grpc.ServicerContext
    ) -> pb.CommitFilesResponse:
        try:
            catalog = self._catalog(request.catalog)
            name = _check_table(request.table)
            commit = self._commit_request(catalog, name, request)
            committed = self._groups.commit(catalog, name, commit, context.peer())
            return pb.CommitFilesResponse(
                version=committed.version,
                replayed=committed.replayed,
                commit_ts=committed.commit_ts,
                group_size=committed.group_size,
            )
        except Exception as exc:
            abort_with(context, exc)

    def CommitTables(
        self, request: pb.CommitTablesRequest, context: grpc.ServicerContext
    ) -> pb.CommitTablesResponse:
        try:
            catalog = self._catalog(request.catalog)
            if not request.commits:
                raise ValueError("a multi-table commit needs at least one table")
            commits = []
            for commit in request.commits:
                name = _check_table(commit.table)
                commits.append((name, self._commit_request(catalog, name, commit)))
            done = catalog.commit_tables(commits)
            return pb.CommitTablesResponse(
                commits=[
                    pb.CommitFilesResponse(
                        version=c.version, replayed=c.replayed, commit_ts=c.commit_ts, group_size=1
                    )
                    for c in done
                ]
            )
        except Exception as exc:
            abort_with(context, exc)

    def _commit_request(
        self, catalog: Catalog, name: str, request: pb.CommitFilesRequest
    ) -> CommitRequest:
        """Everything a commit request must satisfy, checked before it joins a group."""
        operation = OPERATION_NAMES.get(request.operation)
        if operation is None:
            raise ValueError(f"unknown commit operation {request.operation}")
        base_version = request.base_version if request.HasField("base_version") else None
        read_set = read_set_from_pb(request.read_set) if request.HasField("read_set") else None
        if (operation in DML_OPERATIONS) != (read_set is not None):
            raise ValueError(f"{operation}: row-level statements, and only they, carry a read set")
        if read_set is not None:
            check_read_set(read_set)
            named = (*read_set.removes, *read_set.reads)
            bad = [path for path in named if not check_relative_file(path)]
            if bad:
                raise ValueError(f"read file {bad[0]!r} is not a path inside the table")
        if operation == OVERWRITE and base_version is None:
            raise ValueError("an overwrite needs the base_version it replaces")
        if operation != OVERWRITE and base_version is not None:
            raise ValueError("only an overwrite takes a base_version")
        if base_version is not None and base_version < 0:
            raise ValueError(f"base_version must not be negative, got {base_version}")
        app_id, batch_id = _check_mark(request.mark) if request.HasField("mark") else (None, None)
        meta = catalog.meta(name)
        files = tuple(_check_file(meta, f) for f in request.files)
        change_files = tuple(_check_file(meta, f) for f in request.change_files)
        return CommitRequest(
            operation,
            files,
            _check_job_id(request.job_id),
            request.job_started_ms,
            app_id,
            batch_id,
            base_version,
            read_set,
            request.schema_version if request.HasField("schema_version") else None,
            request.new_schema_json if request.HasField("new_schema_json") else None,
            change_files,
        )

    # --- reads -----------------------------------------------------------------------

    def ListFiles(
        self, request: pb.ListFilesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ListFilesResponse]:
        try:
            catalog = self._catalog(request.catalog)
            name = _check_table(request.table)
            version = request.version if request.HasField("version") else None
            if version is not None and version < 0:
                raise ValueError(f"version must not be negative, got {version}")
            meta, version, files = catalog.files(name, version, file_to_pb)
        except Exception as exc:
            abort_with(context, exc)
        yield pb.ListFilesResponse(
            meta=meta_to_pb(meta), version=version, files=files[:STREAM_BATCH]
        )
        for at in range(STREAM_BATCH, len(files), STREAM_BATCH):
            yield pb.ListFilesResponse(version=version, files=files[at : at + STREAM_BATCH])

    def History(
        self, request: pb.HistoryRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.HistoryResponse]:
        try:
            catalog = self._catalog(request.catalog)
            name = _check_table(request.table)
            meta = catalog.meta(name)
            entries = [
                pb.HistoryEntry(
                    version=h.record.version,
                    operation=h.record.operation,
                    timestamp_ms=h.record.timestamp_ms,
                    commit_ts=h.commit_ts,
                    job_id=h.record.job_id,
                    mark=mark_to_pb(h.record.app_id, h.record.batch_id),
                    added=[entry_to_pb(e) for e in h.added],
                    removed=[entry_to_pb(e) for e in h.removed],
                    gen=h.record.gen,
                    txn_start_ts=h.record.txn_start_ts,
                    change_files=[entry_to_pb(e) for e in h.record.changes],
                )
                for h in catalog.history(
                    name,
                    from_version=request.from_version,
                    to_version=request.to_version if request.HasField("to_version") else None,
                )
            ]
        except Exception as exc:
            abort_with(context, exc)
        yield pb.HistoryResponse(meta=meta_to_pb(meta), entries=entries[:STREAM_BATCH])
        for at in range(STREAM_BATCH, len(entries), STREAM_BATCH):
            yield pb.HistoryResponse(entries=entries[at : at + STREAM_BATCH])

    # --- vacuum ----------------------------------------------------------------------

    def PlanVacuum(
        self, request: pb.PlanVacuumRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.PlanVacuumResponse]:
        try:
            catalog = self._catalog(request.catalog)
            plan = catalog.vacuum_plan(_check_table(request.table), request.cutoff_ms)
        except Exception as exc:
            abort_with(context, exc)
        referenced = sorted(plan.referenced)
        yield pb.PlanVacuumResponse(
            meta=meta_to_pb(plan.meta),
            head=head_to_pb(plan.head),
            keep_from_gen=plan.keep_from_gen,
            min_readable_version=plan.min_readable_version,
            referenced=referenced[:STREAM_BATCH],
        )
        for at in range(STREAM_BATCH, len(referenced), STREAM_BATCH):
            yield pb.PlanVacuumResponse(referenced=referenced[at : at + STREAM_BATCH])

    def FenceVacuum(
        self, request: pb.FenceVacuumRequest, context: grpc.ServicerContext
    ) -> pb.FenceVacuumResponse:
        try:
            catalog = self._catalog(request.catalog)
            name = _check_table(request.table)
            if not request.HasField("plan_head"):
                raise ValueError("a vacuum fence needs the head its plan was made at")
            # The fence reads only the plan's head and first readable version.
            plan = VacuumPlan(
                catalog.meta(name),
                head_from_pb(request.plan_head),
                0,
                set(),
                request.min_readable_version,
            )
            since = catalog.vacuum_fence(name, plan, request.cutoff_ms)
            return pb.FenceVacuumResponse(committed_since=sorted(since))
        except Exception as exc:
            abort_with(context, exc)

    def ClaimDropped(
        self, request: pb.ClaimDroppedRequest, context: grpc.ServicerContext
    ) -> pb.ClaimDroppedResponse:
        try:
            catalog = self._catalog(request.catalog)
            name = _check_table(request.table)
            claimed, pending = catalog.claim_dropped(name, request.cutoff_ms)
            return pb.ClaimDroppedResponse(
                claimed=[dropped_to_pb(d) for d in claimed],
                pending=[dropped_to_pb(d) for d in pending],
            )
        except Exception as exc:
            abort_with(context, exc)


# --- checks at the edge ----------------------------------------------------------------


def _check_table(name: str) -> str:
    if not TABLE_NAME.fullmatch(name):
        raise ValueError(
            f"invalid table name {name!r}: expected 1-128 characters from [A-Za-z0-9_.-], "
            "not starting with '.' or '-'"
        )
    return name


def _check_job_id(job_id: str) -> str:
    if not job_id or len(job_id) > MAX_JOB_ID or "\x00" in job_id:
        raise ValueError(
            f"job_id must be 1-{MAX_JOB_ID} characters without NUL, got {job_id[:80]!r}"
        )
    return job_id


def _check_mark(mark: pb.BatchMark) -> tuple[str, int | str]:
    app_id, batch_id = mark_from_pb(mark)
    if not app_id:
        raise ValueError("app_id must not be empty")
    if isinstance(batch_id, int) and batch_id < 0:
        raise ValueError(f"batch_id must not be negative, got {batch_id}")
    if isinstance(batch_id, str) and not batch_id:
        raise ValueError("batch_id must not be empty")
    return app_id, batch_id


def _check_meta(msg: pb.TableMeta) -> TableMeta:
    meta = meta_from_pb(msg)
    _check_table(meta.name)
    if not meta.schema_json:
        raise ValueError(f"table {meta.name!r}: the schema must not be empty")
    if normalize_location(meta.location, f"table {meta.name!r}: location") != meta.location:
        raise ValueError(
            f"table {meta.name!r}: location {meta.location!r} is not spelled as the catalog "
            f"records it ({normalize_location(meta.location)!r})"
        )
    if len(set(meta.partition_by)) != len(meta.partition_by) or not all(meta.partition_by):
        raise ValueError(f"table {meta.name!r}: partition columns must be distinct names")
    return meta


def _check_retention(meta: TableMeta, msg: pb.Retention) -> Retention:
    try:
        return retention_from_pb(msg)
    except ValueError as exc:
        raise ValueError(f"table {meta.name!r}: retention.{exc}") from None


def _check_file(meta: TableMeta, msg: pb.FileEntry) -> FileEntry:
    entry = entry_from_pb(msg)
    path = entry.path
    if not check_relative_file(path):
        raise ValueError(
            f"file path {path!r} must be relative to the location of table {meta.name!r}, "
            "normalised, and inside it"
        )
    if entry.size_bytes < 0 or entry.record_count < 0:
        raise ValueError(f"{path!r}: size_bytes and record_count must not be negative")
    if set(entry.partition) != set(meta.partition_by):
        raise ValueError(
            f"{path!r}: partition values for {sorted(entry.partition)}, "
            f"the table is partitioned by {list(meta.partition_by)}"
        )
    return entry


def serve_lakehouse(
    manager: TransactionManager,
    server: grpc.Server,
    limits: LakehouseLimits | None = None,
    servicer_class: type[LakehouseServicer] = LakehouseServicer,
) -> LakehouseServicer:
    """Add the service to ``server``; returns it (call ``shutdown`` after the server stops)."""
    servicer = servicer_class(manager, limits)
    pb_grpc.add_LakehouseServiceServicer_to_server(servicer, server)
    return servicer


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LakehouseService"].full_name

__all__ = [
    "SERVICE_NAME",
    "LakehouseServicer",
    "serve_lakehouse",
]
