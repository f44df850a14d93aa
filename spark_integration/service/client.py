"""The catalog through a gateway's ``LakehouseService``: what ``Lakehouse`` uses on a
remote manager.

Same methods as :class:`~spark_integration.engine.catalog.Catalog`, each one call (or one
stream) to the gateway, which runs the catalog next to the store. Only commits need
more than one call: a commit whose reply is lost (the gateway died, the network
failed, the gateway could not settle its outcome) is sent again with the same
``job_id`` until the gateway answers. The gateway keeps a mark per job id in the
commit's own transaction, so the answer is the version the first send committed, or
a commit made now if it never did; never two versions. Only when the gateway stays
unreachable until the commit deadline does the caller get ``CommitUnknownError``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from spark_integration.engine import Catalog, CommitRequest, Committed, HistoryEntry
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.catalog import Prepared
from spark_integration.engine.lifecycle import DroppedTable
from spark_integration.engine.model import (
    OVERWRITE,
    EntryFactory,
    FileEntry,
    Layout,
    LogRecord,
    TableMeta,
    decode_stats,
)
from spark_integration.engine.read_set import ReadSet
from spark_integration.engine.retention import ExpireResult, Retention
from spark_integration.engine.table_access import RETRY_BASE_S
from spark_integration.engine.vacuum_plan import VacuumPlan
from spark_integration.service.convert import (
    OPERATIONS,
    dropped_from_pb,
    entries_to_pb,
    entry_from_pb,
    head_from_pb,
    head_to_pb,
    mark_from_pb,
    mark_to_pb,
    meta_from_pb,
    meta_to_pb,
    partition_from_pb,
    read_set_to_pb,
    retention_to_pb,
)
from txn.errors import CommitUnknownError
from txn.remote import RemoteTransactionManager
from wire.channels import call, stream
from wire.error_codes import COMMIT_UNKNOWN, RpcError, ServiceUnavailableError
from wire.errors import OracleFencedError
from wire.v1 import lakehouse_pb2 as pb
from wire.v1 import lakehouse_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

E = TypeVar("E")
R = TypeVar("R")

#: Backoff between sends of a commit whose outcome is unknown: the gateway may be
#: restarting, so wait longer than between conflicts at the head.
RESEND_CAP_S = 1.0


def _unknown(exc: BaseException) -> bool:
    """Whether a commit that failed with ``exc`` may have committed (send it again)."""
    if isinstance(exc, ServiceUnavailableError | OracleFencedError):
        return True
    return isinstance(exc, RpcError) and exc.reason == COMMIT_UNKNOWN


class RemoteCatalog:
    """Lakehouse metadata of one catalog, through a gateway. Thread-safe."""

    def __init__(
        self,
        tm: RemoteTransactionManager,
        catalog: str,
        *,
        commit_timeout_s: float = 300.0,
        failpoints: fp.FailPoints | None = None,
    ) -> None:
        self._tm = tm
        self._conn = tm.connection
        self._stub = pb_grpc.LakehouseServiceStub(self._conn.channel)
        self.layout = Layout(catalog)
        self._commit_timeout_s = commit_timeout_s
        self.failpoints = fp.FailPoints() if failpoints is None else failpoints
        self._meta: dict[str, TableMeta] = {}
        #: Retention runs over the gateway's transactions (its cells are plain cells,
        #: and the service needs no call for them); the gateway itself expires tables
        #: after checkpoints.
        self._cells = Catalog(
            tm, catalog, commit_timeout_s=commit_timeout_s, failpoints=self.failpoints
        )

    @property
    def _catalog(self) -> str:
        return self.layout.catalog

    # --- reads ------------------------------------------------------------------------

    def meta(self, name: str) -> TableMeta:
        cached = self._meta.get(name)
        if cached is not None:
            return cached
        return self.prepare(name).meta

    def prepare(
        self, name: str, app_id: str | None = None, batch_id: int | str | None = None
    ) -> Prepared:
        request = pb.GetTableRequest(
            catalog=self._catalog, table=name, mark=mark_to_pb(app_id, batch_id)
        )
        got = call(self._stub.GetTable, request, self._conn, self._tm.timeout_s)
        meta = meta_from_pb(got.meta)
        self._meta[name] = meta
        replayed = got.replayed_version if got.HasField("replayed_version") else None
        return Prepared(meta, head_from_pb(got.head), replayed)

    def version_at(self, name: str, timestamp_ms: int) -> int:
        """The version that was the table's latest at ``timestamp_ms`` (see ``Catalog``)."""
        request = pb.GetTableRequest(catalog=self._catalog, table=name, as_of_ms=timestamp_ms)
        got = call(self._stub.GetTable, request, self._conn, self._tm.timeout_s)
        return got.version_as_of

    def list_tables(self) -> list[str]:
        request = pb.ListTablesRequest(catalog=self._catalog)
        return list(call(self._stub.ListTables, request, self._conn, self._tm.timeout_s).tables)

    def files(
        self, name: str, version: int | None, make: EntryFactory[E]
    ) -> tuple[TableMeta, int, list[E]]:
        request = pb.ListFilesRequest(catalog=self._catalog, table=name, version=version)
        meta: TableMeta | None = None
        at = -1
        out: list[E] = []
        for batch in stream(self._stub.ListFiles, request, self._conn, self._tm.timeout_s):
            if meta is None:
                meta = meta_from_pb(batch.meta)
            at = batch.version
            out += [
                make(
                    f.path,
                    f.size_bytes,
                    f.record_count,
                    partition_from_pb(f.partition),
                    decode_stats(f.stats_json),
                )
                for f in batch.files
            ]
        assert meta is not None, "the gateway's first batch carries the table's metadata"
        return meta, at, out

    def history(
        self, name: str, *, from_version: int = 0, to_version: int | None = None
    ) -> list[HistoryEntry]:
        request = pb.HistoryRequest(
            catalog=self._catalog, table=name, from_version=from_version, to_version=to_version
        )
        out: list[HistoryEntry] = []
        for batch in stream(self._stub.History, request, self._conn, self._tm.timeout_s):
            for h in batch.entries:
                app_id, batch_id = mark_from_pb(h.mark) if h.HasField("mark") else (None, None)
                record = LogRecord(
                    h.version,
                    h.operation,
                    h.timestamp_ms,
                    h.gen,
                    len(h.added),
                    h.job_id if h.HasField("job_id") else None,
                    app_id,
                    batch_id,
                    h.txn_start_ts,
                    tuple(entry_from_pb(e) for e in h.change_files),
                )
                out.append(
                    HistoryEntry(
                        record,
                        h.commit_ts if h.HasField("commit_ts") else None,
                        [entry_from_pb(e) for e in h.added],
                        [entry_from_pb(e) for e in h.removed],
                    )
                )
        return out

    # --- changes ----------------------------------------------------------------------

    def drop_table(self, name: str) -> TableMeta:
        """Drop the table's metadata in the gateway; returns it (for its files)."""
        request = pb.DropTableRequest(catalog=self._catalog, table=name)
        got = call(self._stub.DropTable, request, self._conn, self._commit_timeout_s)
        self._meta.pop(name, None)
        return meta_from_pb(got.meta)

    def claim_dropped(
        self, name: str, cutoff_ms: int
    ) -> tuple[list[DroppedTable], list[DroppedTable]]:
        """``Catalog.claim_dropped`` in the gateway."""
        request = pb.ClaimDroppedRequest(catalog=self._catalog, table=name, cutoff_ms=cutoff_ms)
        got = call(self._stub.ClaimDropped, request, self._conn, self._commit_timeout_s)
        return (
            [dropped_from_pb(d) for d in got.claimed],
            [dropped_from_pb(d) for d in got.pending],
        )

    def rename_table(self, old: str, new: str) -> None:
        """Move the table to the name ``new`` in the gateway; its files stay."""
        request = pb.RenameTableRequest(catalog=self._catalog, table=old, new_name=new)
        call(self._stub.RenameTable, request, self._conn, self._commit_timeout_s)
        self._meta.pop(old, None)
        self._meta.pop(new, None)

    def create(
        self,
        meta: TableMeta,
        job_id: str,
        retention: Retention | None = None,
        *,
        over_dropped: bool = False,
    ) -> int | None:
        """Create the table, with its ``retention`` (``None``: the defaults) written in
        the same transaction by the service; ``over_dropped`` as ``Catalog.create``."""
        request = pb.CreateTableRequest(
            catalog=self._catalog,
            meta=meta_to_pb(meta),
            job_id=job_id,
            retention=retention_to_pb(retention),
            over_dropped=over_dropped,
        )
        got = call(self._stub.CreateTable, request, self._conn, self._commit_timeout_s)
        if retention is not None and self._cells.retention(meta.name) != retention:
            # A gateway older than the retention field ignores it: set it as those
            # clients did, in a second transaction, rather than leave the defaults.
            log.warning(
                "the gateway at %s created table %r without its retention (an older "
                "percolake?): setting it in a second transaction",
                self._conn.address,
                meta.name,
            )
            self._cells.set_retention(meta.name, retention)
        return got.commit_ts if got.HasField("commit_ts") else None

    def commit_files(
        self,
        name: str,
        operation: str,
        files: Sequence[FileEntry],
        *,
        job_id: str,
        job_started_ms: int,
        app_id: str | None = None,
        batch_id: int | str | None = None,
        base_version: int | None = None,
        read_set: ReadSet | None = None,
        schema_version: int | None = None,
        new_schema_json: str | None = None,
        change_files: Sequence[FileEntry] = (),
    ) -> Committed:
        """Commit ``files`` as the next version through the gateway (see the module doc)."""
        request = self._commit_pb(
            name,
            CommitRequest(
                operation,
                tuple(files),
                job_id,
                job_started_ms,
                app_id,
                batch_id,
                base_version,
                read_set,
                schema_version,
                new_schema_json,
                tuple(change_files),
            ),
        )
        what = f"{operation.lower()} to table {name!r} (job {job_id})"
        got = self._send(self._stub.CommitFiles, request, what, job_id)
        commit_ts = got.commit_ts if got.HasField("commit_ts") else None
        return Committed(got.version, commit_ts, got.replayed, max(got.group_size, 1))

    def commit_tables(self, commits: Sequence[tuple[str, CommitRequest]]) -> list[Committed]:
        """Commit to several tables in one transaction through the gateway: all or none."""
        if not commits:
            return []
        request = pb.CommitTablesRequest(
            catalog=self._catalog, commits=[self._commit_pb(n, r) for n, r in commits]
        )
        names = ", ".join(repr(n) for n, _ in commits)
        job_id = commits[0][1].job_id
        got = self._send(self._stub.CommitTables, request, f"commit to tables {names}", job_id)
        return [
            Committed(c.version, c.commit_ts if c.HasField("commit_ts") else None, c.replayed)
            for c in got.commits
        ]

    def _commit_pb(self, name: str, r: CommitRequest) -> pb.CommitFilesRequest:
        if r.operation not in OPERATIONS:
            raise ValueError(f"unknown operation {r.operation!r}")
        if r.operation == OVERWRITE and r.base_version is None:
            raise ValueError("an overwrite needs the base_version it replaces")
        return pb.CommitFilesRequest(
            catalog=self._catalog,
            table=name,
            operation=OPERATIONS[r.operation],
            files=entries_to_pb(r.files),
            job_id=r.job_id,
            job_started_ms=r.job_started_ms,
            mark=mark_to_pb(r.app_id, r.batch_id),
            base_version=r.base_version,
            read_set=read_set_to_pb(r.read_set),
            schema_version=r.schema_version,
            new_schema_json=r.new_schema_json,
            change_files=entries_to_pb(r.change_files),
        )

    def _send(self, method: Callable[..., R], request: object, what: str, job_id: str) -> R:
        """Send a commit until the gateway answers it (see the module docstring)."""
        deadline = time.monotonic() + self._commit_timeout_s
        sends = 0
        while True:
            sends += 1
            left = max(deadline - time.monotonic(), 1.0)
            try:
                return call(method, request, self._conn, left)
            except Exception as exc:
                if not _unknown(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise CommitUnknownError(
                        f"{what}: the gateway did not answer within "
                        f"{self._commit_timeout_s:.0f} s ({sends} sends); it may have "
                        f"committed: {exc}",
                        start_ts=-1,
                    ) from exc
                log.info("%s: outcome unknown (%s); sending it again", what, exc)
                self.failpoints.hit(fp.SETTLE_COMMIT, job_id)
                time.sleep(random.uniform(0, min(RESEND_CAP_S, RETRY_BASE_S * 2**sends)))

    # --- vacuum -----------------------------------------------------------------------

    def vacuum_plan(self, name: str, cutoff_ms: int) -> VacuumPlan:
        request = pb.PlanVacuumRequest(catalog=self._catalog, table=name, cutoff_ms=cutoff_ms)
        first: pb.PlanVacuumResponse | None = None
        referenced: set[str] = set()
        for batch in stream(self._stub.PlanVacuum, request, self._conn, self._tm.timeout_s):
            if first is None:
                first = batch
            referenced.update(batch.referenced)
        assert first is not None, "the gateway's first batch carries the plan"
        return VacuumPlan(
            meta_from_pb(first.meta),
            head_from_pb(first.head),
            first.keep_from_gen,
            referenced,
            first.min_readable_version,
        )

    def vacuum_fence(self, name: str, plan: VacuumPlan, cutoff_ms: int) -> set[str]:
        request = pb.FenceVacuumRequest(
            catalog=self._catalog,
            table=name,
            cutoff_ms=cutoff_ms,
            plan_head=head_to_pb(plan.head),
            min_readable_version=plan.min_readable_version,
        )
        got = call(self._stub.FenceVacuum, request, self._conn, self._commit_timeout_s)
        return set(got.committed_since)

    # --- retention ----------------------------------------------------------------------

    def retention(self, name: str) -> Retention:
        return self._cells.retention(name)

    def set_retention(self, name: str, retention: Retention) -> None:
        self._cells.set_retention(name, retention)

    def expire(self, name: str, now_ms: int, *, max_rows: int | None = None) -> ExpireResult:
        """``Catalog.expire`` over the gateway's transactions."""
        return self._cells.expire(name, now_ms, max_rows=max_rows)
