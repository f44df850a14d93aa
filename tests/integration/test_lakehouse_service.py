"""The gateway's ``LakehouseService`` in the deployed topology: writer processes, gateway processes.

Writers are separate processes (forked from a ``multiprocessing`` fork server), each
with its own remote manager, committing one-file metadata-only appends through
``Lakehouse.append_files`` as Spark drivers would. Gateways are real ``percolake serve``
processes; where a test must make something happen at a given point of a group commit,
the gateway is the test build (``python -m percolake.tools.chaos.serve``), whose group
committer a control file steers (:mod:`percolake.tools.chaos.failpoints_serve`): form
the first group only once K requests are queued (so it has K members, every run), or
block a group before its transaction or after its commit point while the test kills
the gateway.

Every test ends with the same audit of the table (:func:`audit`): versions dense from
0, each commit in exactly one version at the version its writer was told, and no file
of a definitely failed commit named by any version.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType

from percolake.tools.chaos._lakehouse import LakehouseAppends, ServiceLakehouses
from percolake.tools.chaos.client import FailoverManager
from percolake.tools.chaos.failpoints_serve import fired_path, write_lakehouse_control
from spark_integration import ConcurrentModificationError, DataFile, Lakehouse
from spark_integration.engine import Catalog
from spark_integration.engine.model import APPEND, CREATE
from spark_integration.service.client import RemoteCatalog
from spark_integration.spark import filesystem
from spark_integration.spark.hook import STAGING_PREFIX
from tests.servers import ServerProcess, steered_server
from txn import TransactionManager
from txn.remote import RemoteTransactionManager
from wire.error_codes import (
    INVALID_ARGUMENT,
    REASON_KEY,
    TABLE_EXISTS,
    TABLE_NOT_FOUND,
    UNAUTHENTICATED,
    VERSION_NOT_FOUND,
)
from wire.v1 import lakehouse_pb2 as pb
from wire.v1 import lakehouse_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
TABLE = "events"
CATALOG = "lakehouse"
#: Writers keep resending a commit whose reply was lost this long (the gateway restarts).
WRITER_COMMIT_TIMEOUT_S = 120.0
WRITERS_JOIN_S = 180.0
FIRED_WAIT_S = 60.0


# --- writer processes ------------------------------------------------------------------


@dataclass(frozen=True)
class WriterSpec:
    """What one writer process commits: ``commits`` one-file appends to :data:`TABLE`."""

    gateway: str
    warehouse: str
    writer: int
    commits: int
    #: Commits (by index) that claim files written long ago: a vacuum fenced them off,
    #: so they definitely fail (ConcurrentModificationError), even inside a group.
    stale: tuple[int, ...] = ()
    #: With an (app_id, batch_id) per commit: commit k is batch k of app ``app_id``.
    app_id: str | None = None
    #: Write each commit's Parquet file (one row) before committing it, so the audit
    #: can check that every file a version names is there (otherwise metadata only).
    write_files: bool = False


@dataclass
class WriterResult:
    writer: int
    committed: dict[str, int] = field(default_factory=dict)  # file path -> version told
    failed: list[str] = field(default_factory=list)  # definitely not committed
    error: str | None = None  # anything else: the test fails


def file_for(warehouse: str, writer: int, k: int) -> DataFile:
    """The one file of commit ``k`` of ``writer``, in a job folder of its own."""
    path = f"{warehouse}/{TABLE}/{STAGING_PREFIX}w{writer}-{k}/day=d{k % 3}/part-0.parquet"
    return DataFile(path, size_bytes=1000 + k, record_count=k + 1, partition={"day": f"d{k % 3}"})


def write_file(data: DataFile) -> DataFile:
    """Write ``data``'s file (one row) through the lakehouse's file-system layer."""
    fs, fs_path = filesystem.resolve(data.path)
    filesystem.make_dirs(data.path.rsplit("/", 1)[0])
    row = pa.table({"id": pa.array([data.record_count], pa.int64())})
    pq.write_table(row, fs_path, filesystem=fs)
    return DataFile(data.path, filesystem.file_size(data.path), 1, data.partition)


def _writer_main(spec: WriterSpec, env: dict[str, str], start: Any, results: Any) -> None:
    # The environment of the test that starts it (a spawned process's), not the fork
    # server's: the S3 fixture exports MinIO's AWS variables after the server started.
    os.environ.clear()
    os.environ.update(env)
    result = WriterResult(spec.writer)
    try:
        tm = TransactionManager.remote(spec.gateway, timeout_s=30)
        try:
            lh = Lakehouse(tm, spec.warehouse, commit_timeout_s=WRITER_COMMIT_TIMEOUT_S)
            lh.schema(TABLE)  # the table's metadata is cached before the race starts
            start.wait(60)
            for k in range(spec.commits):
                data = file_for(spec.warehouse, spec.writer, k)
                if spec.write_files:
                    data = write_file(data)
                batch = {"app_id": spec.app_id, "batch_id": k} if spec.app_id else {}
                try:
                    version = lh.append_files(
                        TABLE,
                        [data],
                        written_since_ms=1 if k in spec.stale else None,
                        **batch,  # type: ignore[arg-type]
                    )
                except ConcurrentModificationError:
                    result.failed.append(data.path)
                    continue
                result.committed[data.path] = version
        finally:
            tm.close()
    except BaseException:
        result.error = traceback.format_exc()
    results.put(result)


def _writer_context() -> Any:
    """Writer processes fork from a fork server that imported this module once.

    A spawned writer imports this module for itself (pyspark, pyarrow, the Spark layer:
    about 2.5 s of CPU each, most of a writer's cost, 42 writers in this file); forked
    from the server, it starts from those imports, in a fresh process that never made
    a gRPC channel (the server is started by exec, as a spawned process is, and forks
    only), with the environment of the test that starts it (:func:`_writer_main`).
    :func:`_stop_fork_server` stops the server after this module's tests.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


@pytest.fixture(scope="module", autouse=True)
def _stop_fork_server() -> Iterator[None]:
    yield
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's (its own tests use it)
    if stop is not None:
        stop()


class Writers:
    """Writer processes started together (forked from :func:`_writer_context`'s server),
    each running :func:`_writer_main`."""

    def __init__(self, specs: list[WriterSpec]) -> None:
        ctx = _writer_context()
        self._results = ctx.Queue()
        self._start = ctx.Barrier(len(specs))
        self._procs = [
            ctx.Process(
                target=_writer_main,
                args=(s, dict(os.environ), self._start, self._results),
                daemon=True,
            )
            for s in specs
        ]
        for p in self._procs:
            p.start()

    def join(self) -> list[WriterResult]:
        deadline = time.monotonic() + WRITERS_JOIN_S
        out: list[WriterResult] = []
        try:
            while len(out) < len(self._procs):
                out.append(self._results.get(timeout=max(deadline - time.monotonic(), 1.0)))
        finally:
            for p in self._procs:
                p.join(5)
                if p.is_alive():
                    p.kill()  # ours, by its handle
        errors = [r.error for r in out if r.error]
        assert not errors, "\n".join(errors)
        return sorted(out, key=lambda r: r.writer)


# --- the audit ------------------------------------------------------------------------


@dataclass
class Audit:
    history: list[Any]  # HistoryEntry of the gateway's catalog, oldest first
    version_of: dict[str, int]  # file path -> the version that added it

    def groups(self) -> dict[int, list[int]]:
        """Versions by the transaction (its start timestamp) that committed them."""
        out: dict[int, list[int]] = {}
        for h in self.history[1:]:
            out.setdefault(h.record.txn_start_ts, []).append(h.record.version)
        return out

    def version_of_job(self) -> dict[str, int]:
        return {h.record.job_id: h.record.version for h in self.history}


def audit(gateway: str, warehouse: str, results: list[WriterResult]) -> Audit:
    """Every commit exactly once, dense versions, told versions right, failed ones absent."""
    tm = TransactionManager.remote(gateway, timeout_s=30)
    try:
        assert isinstance(tm, RemoteTransactionManager)
        history = RemoteCatalog(tm, CATALOG).history(TABLE)
        lh = Lakehouse(tm, warehouse)
        latest = {f.path for f in lh.files(TABLE)}
        public = lh.history(TABLE)
    finally:
        tm.close()
    location = f"{warehouse}/{TABLE}"
    versions = [h.record.version for h in history]
    assert versions == list(range(len(history))), f"versions not dense: {versions}"
    assert [c.version for c in public] == versions
    assert history[0].record.operation == CREATE
    assert all(h.record.operation == APPEND for h in history[1:])
    jobs = Counter(h.record.job_id for h in history)
    assert [j for j, n in jobs.items() if n > 1] == [], "a job committed twice"
    version_of: dict[str, int] = {}
    for h in history[1:]:
        assert len(h.added) == 1, f"version {h.record.version} added {len(h.added)} files"
        path = f"{location}/{h.added[0].path}"
        assert path not in version_of, f"{path} in versions {version_of[path]} and {h.record}"
        version_of[path] = h.record.version
    told = {path: v for r in results for path, v in r.committed.items()}
    assert version_of == told, "the history is not exactly the commits the writers were told"
    failed = {path for r in results for path in r.failed}
    assert not failed & set(version_of), "a definitely failed commit's file is in a version"
    assert latest == set(version_of)
    # Commit timestamps follow the versions; versions of one group share their transaction's.
    stamps = [h.commit_ts for h in history]
    assert None not in stamps
    assert stamps == sorted(stamps)  # type: ignore[type-var]
    return Audit(history, version_of)


# --- fixtures and helpers -------------------------------------------------------------


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")


def create_table(gateway: str, warehouse: str) -> None:
    tm = TransactionManager.remote(gateway, timeout_s=30)
    try:
        Lakehouse(tm, warehouse).create_table(TABLE, SCHEMA, partition_by="day")
    finally:
        tm.close()


def fence_old_files(gateway: str, warehouse: str) -> None:
    """A vacuum with a cutoff of now: commits of files written before it must fail."""
    tm = TransactionManager.remote(gateway, timeout_s=30)
    try:
        Lakehouse(tm, warehouse).vacuum(TABLE, retain_seconds=0)
    finally:
        tm.close()


def wait_fired(control: Path, rule_id: str) -> dict[str, Any]:
    path = Path(fired_path(str(control), rule_id))
    deadline = time.monotonic() + FIRED_WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"rule {rule_id} never fired"
        time.sleep(0.02)
    fired: dict[str, Any] = json.loads(path.read_text())
    return fired


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Servers a test started; stopped (by pid) whatever happens."""
    started: list[ServerProcess] = []
    yield started
    for server in reversed(started):
        server.stop()


def sqlite_store(tmp_path: Path, name: str = "store") -> list[str]:
    return ["--store", f"sqlite:///{tmp_path}/{name}.db"]


# --- 1. group commit with writer processes ----------------------------------------------


def test_eight_writer_processes_commit_every_append_once_and_in_groups(
    tmp_path: Path, warehouse: str, servers: list[ServerProcess]
) -> None:
    """The first group is formed once all 8 writers' first commits are queued, so they
    commit as one group: one transaction, 8 consecutive versions."""
    control = tmp_path / "control.json"
    write_lakehouse_control(str(control), {"hold_first_group_until": 8})
    gw = steered_server("all", sqlite_store(tmp_path), tmp_path, control).start()
    servers.append(gw)
    create_table(gw.address, warehouse)
    writers = Writers([WriterSpec(gw.address, warehouse, w, commits=6) for w in range(8)])
    results = writers.join()
    checked = audit(gw.address, warehouse, results)
    assert len(checked.history) == 1 + 8 * 6
    for r in results:  # each process's versions are its own and increase
        told = list(r.committed.values())
        assert told == sorted(set(told)) and len(told) == 6
    groups = checked.groups()
    biggest = max(groups.values(), key=len)
    assert len(biggest) == 8, f"no group of 8: versions by transaction {groups}"
    for versions in groups.values():  # a group's versions are consecutive
        assert versions == list(range(versions[0], versions[0] + len(versions)))
    group_stamps = {checked.history[v].commit_ts for v in biggest}
    assert len(group_stamps) == 1, "one transaction, one commit timestamp"


def test_group_size_is_reported_to_each_member(
    tmp_path: Path, warehouse: str, servers: list[ServerProcess]
) -> None:
    """The response's group_size: each of the 4 members of the held group is told 4."""
    control = tmp_path / "control.json"
    write_lakehouse_control(str(control), {"hold_first_group_until": 4})
    gw = steered_server("all", sqlite_store(tmp_path), tmp_path, control).start()
    servers.append(gw)
    create_table(gw.address, warehouse)
    channel = grpc.insecure_channel(gw.address)
    stub = pb_grpc.LakehouseServiceStub(channel)
    try:
        futures = [
            stub.CommitFiles.future(
                commit_request(f"{STAGING_PREFIX}g{k}/day=d1/part-0.parquet", job_id=f"g{k}"),
                timeout=60,
            )
            for k in range(4)
        ]
        replies = [f.result() for f in futures]
    finally:
        channel.close()
    assert sorted(r.version for r in replies) == [1, 2, 3, 4]
    assert [r.group_size for r in replies] == [4, 4, 4, 4]


# --- 2. replays across processes ------------------------------------------------------


def test_replays_from_several_processes_commit_each_batch_once(
    tmp_path: Path, warehouse: str, servers: list[ServerProcess]
) -> None:
    """Six processes send the same (app_id, batch_id)s with files of their own, at once
    (batch 0's six sends in one group): each batch commits one version, and every
    process is told that version."""
    control = tmp_path / "control.json"
    write_lakehouse_control(str(control), {"hold_first_group_until": 6})
    gw = steered_server("all", sqlite_store(tmp_path), tmp_path, control).start()
    servers.append(gw)
    create_table(gw.address, warehouse)
    specs = [WriterSpec(gw.address, warehouse, w, commits=4, app_id="stream") for w in range(6)]
    results = Writers(specs).join()
    tm = TransactionManager.remote(gw.address, timeout_s=30)
    try:
        history = Lakehouse(tm, warehouse).history(TABLE)
    finally:
        tm.close()
    assert [c.version for c in history] == list(range(5))
    assert [(c.app_id, c.batch_id) for c in history[1:]] == [("stream", k) for k in range(4)]
    for k, commit in enumerate(history[1:]):
        told = {r.committed[file_for(warehouse, r.writer, k).path] for r in results}
        assert told == {commit.version}, f"batch {k}: processes were told {told}"
        assert len(commit.added_files) == 1
    # Exactly one process's file per batch: the replays added nothing.
    named = {path for c in history for path in c.added_files}
    assert len(named) == 4


# --- 3. a gateway killed in the middle of a group ---------------------------------------


@pytest.mark.parametrize("at", ["after", "before"])
def test_a_gateway_killed_mid_group_loses_and_doubles_nothing(
    tmp_path: Path, warehouse: str, servers: list[ServerProcess], at: str
) -> None:
    """A group of 8 members blocks ``after`` its commit point (before any reply) or
    ``before`` its transaction; the test kills the gateway there (SIGKILL) and restarts
    it on the same store and port. The writers, resending with the same job id, finish
    with every commit exactly once; commits that definitely failed (fenced by a vacuum)
    are in no version."""
    control = tmp_path / "control.json"
    rule = {"id": "kill", "at": at, "min_size": 2, "action": "block"}
    write_lakehouse_control(str(control), {"hold_first_group_until": 8, "rules": [rule]})
    store = sqlite_store(tmp_path)
    gw = steered_server("all", store, tmp_path, control).start()
    servers.append(gw)
    create_table(gw.address, warehouse)
    fence_old_files(gw.address, warehouse)
    # Commit 2 of the even writers claims old files: definitely failed, every time.
    specs = [
        WriterSpec(gw.address, warehouse, w, commits=4, stale=(2,) if w % 2 == 0 else ())
        for w in range(8)
    ]
    writers = Writers(specs)
    fired = wait_fired(control, "kill")
    assert fired["pid"] == gw.pid and len(fired["job_ids"]) == 8
    gw.kill()
    write_lakehouse_control(str(control), {})
    gw.start(port=gw.port)
    results = writers.join()
    checked = audit(gw.address, warehouse, results)
    assert sum(len(r.failed) for r in results) == 4
    assert sum(len(r.committed) for r in results) == 8 * 4 - 4
    by_job = checked.version_of_job()
    members = fired["job_ids"]
    assert all(job in by_job for job in members), "a member of the killed group was lost"
    member_txns = {checked.history[by_job[job]].record.txn_start_ts for job in members}
    if at == "after":  # committed by the killed gateway, in one transaction; told on resend
        assert len(member_txns) == 1


def test_writers_to_an_s3_table_lose_and_double_nothing_when_the_gateway_is_killed(
    tmp_path: Path, s3_warehouse: str, servers: list[ServerProcess]
) -> None:
    """Four writer processes write Parquet objects to an ``s3://`` table on MinIO and
    commit them through a gateway killed -9 after a group's commit point (before any
    reply) and restarted: every batch is in exactly one version, as told, and every
    object a version names is in the bucket (issue 25)."""
    control = tmp_path / "control.json"
    rule = {"id": "kill", "at": "after", "min_size": 2, "action": "block"}
    write_lakehouse_control(str(control), {"hold_first_group_until": 4, "rules": [rule]})
    gw = steered_server("all", sqlite_store(tmp_path), tmp_path, control).start()
    servers.append(gw)
    create_table(gw.address, s3_warehouse)
    specs = [
        WriterSpec(gw.address, s3_warehouse, w, commits=5, app_id=f"w{w}", write_files=True)
        for w in range(4)
    ]
    writers = Writers(specs)
    fired = wait_fired(control, "kill")
    assert fired["pid"] == gw.pid and len(fired["job_ids"]) == 4
    gw.kill()
    write_lakehouse_control(str(control), {})
    gw.start(port=gw.port)
    results = writers.join()
    checked = audit(gw.address, s3_warehouse, results)
    assert len(checked.version_of) == 4 * 5
    missing = [path for path in checked.version_of if not filesystem.exists(path)]
    assert missing == [], f"versions name objects that are not in the bucket: {missing}"
    assert all(path.startswith("s3://") for path in checked.version_of)


# --- 4. two gateways on one store ------------------------------------------------------


def test_two_gateways_on_one_store_commit_every_append_once(
    tmp_path: Path, warehouse: str, servers: list[ServerProcess]
) -> None:
    """Writers split across two ``serve txn`` gateways sharing one oracle, lock server
    and store: each gateway group-commits its own writers, and the head row's conflict
    decides between the gateways."""
    tso = ServerProcess("tso", sqlite_store(tmp_path, "tso"), tmp_path).start()
    servers.append(tso)
    locks = ServerProcess("locks", [], tmp_path).start()
    servers.append(locks)
    gateways: list[ServerProcess] = []
    for g in range(2):
        control = tmp_path / f"control{g}.json"
        write_lakehouse_control(str(control), {"hold_first_group_until": 4})
        args = [*sqlite_store(tmp_path), "--tso", tso.address, "--locks", locks.address]
        gateways.append(steered_server("txn", args, tmp_path, control).start())
        servers.append(gateways[-1])
    create_table(gateways[0].address, warehouse)
    specs = [WriterSpec(gateways[w % 2].address, warehouse, w, commits=5) for w in range(8)]
    results = Writers(specs).join()
    checked = audit(gateways[1].address, warehouse, results)
    assert len(checked.history) == 1 + 8 * 5
    big_groups = [v for v in checked.groups().values() if len(v) >= 4]
    assert len(big_groups) >= 2, f"each gateway commits a group: {checked.groups()}"


# --- 5. the edge: bad requests, auth, reflection ----------------------------------------


def commit_request(path: str, job_id: str = "job-1", **fields: Any) -> pb.CommitFilesRequest:
    request = pb.CommitFilesRequest(
        catalog=CATALOG,
        table=TABLE,
        operation=pb.COMMIT_OPERATION_APPEND,
        files=[
            pb.FileEntry(
                path=path,
                size_bytes=10,
                record_count=1,
                partition=[pb.PartitionValue(column="day", value="d1")],
            )
        ],
        job_id=job_id,
        job_started_ms=int(time.time() * 1000),
    )
    for name, value in fields.items():
        if isinstance(value, list):
            del getattr(request, name)[:]
            getattr(request, name).extend(value)
        else:
            setattr(request, name, value)
    return request


GOOD_PATH = f"{STAGING_PREFIX}j1/day=d1/part-0.parquet"

#: (what, method, request, status code, reason)
BAD_REQUESTS: list[tuple[str, str, Any, grpc.StatusCode, str]] = [
    (
        "bad table name",
        "CommitFiles",
        commit_request(GOOD_PATH, table="../etc"),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "bad catalog",
        "CommitFiles",
        commit_request(GOOD_PATH, catalog="a/b"),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "absolute file path",
        "CommitFiles",
        commit_request("/etc/passwd"),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "file path with ..",
        "CommitFiles",
        commit_request("../other/part-0.parquet"),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "file path not normalised",
        "CommitFiles",
        commit_request(f"{STAGING_PREFIX}j1/../../x.parquet"),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "partition values not the table's",
        "CommitFiles",
        commit_request(
            GOOD_PATH,
            files=[
                pb.FileEntry(
                    path=GOOD_PATH, partition=[pb.PartitionValue(column="hour", value="1")]
                )
            ],
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "overwrite without base_version",
        "CommitFiles",
        commit_request(GOOD_PATH, operation=pb.COMMIT_OPERATION_OVERWRITE),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "append with a base_version",
        "CommitFiles",
        commit_request(GOOD_PATH, base_version=0),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "unspecified operation",
        "CommitFiles",
        commit_request(GOOD_PATH, operation=pb.COMMIT_OPERATION_UNSPECIFIED),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "unknown operation",
        "CommitFiles",
        commit_request(GOOD_PATH, operation=7),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "empty job_id",
        "CommitFiles",
        commit_request(GOOD_PATH, job_id=""),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "negative size",
        "CommitFiles",
        commit_request(
            GOOD_PATH,
            files=[
                pb.FileEntry(
                    path=GOOD_PATH,
                    size_bytes=-1,
                    partition=[pb.PartitionValue(column="day", value="d1")],
                )
            ],
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "commit to a missing table",
        "CommitFiles",
        commit_request(GOOD_PATH, table="missing"),
        grpc.StatusCode.NOT_FOUND,
        TABLE_NOT_FOUND,
    ),
    (
        "negative version",
        "ListFiles",
        pb.ListFilesRequest(catalog=CATALOG, table=TABLE, version=-1),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "version beyond the head",
        "ListFiles",
        pb.ListFilesRequest(catalog=CATALOG, table=TABLE, version=99),
        grpc.StatusCode.OUT_OF_RANGE,
        VERSION_NOT_FOUND,
    ),
    (
        "history of a missing table",
        "History",
        pb.HistoryRequest(catalog=CATALOG, table="missing"),
        grpc.StatusCode.NOT_FOUND,
        TABLE_NOT_FOUND,
    ),
    (
        "existing table",
        "CreateTable",
        pb.CreateTableRequest(
            catalog=CATALOG,
            meta=pb.TableMeta(name=TABLE, schema_json="{}", location="/tmp/x"),
            job_id="create-again",
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        TABLE_EXISTS,
    ),
    (
        "relative table location",
        "CreateTable",
        pb.CreateTableRequest(
            catalog=CATALOG,
            meta=pb.TableMeta(name="other", schema_json="{}", location="rel/x"),
            job_id="create-other",
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
    (
        "negative batch id",
        "GetTable",
        pb.GetTableRequest(catalog=CATALOG, table=TABLE, mark=pb.BatchMark(app_id="a", int_id=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ),
]


def _call(stub: pb_grpc.LakehouseServiceStub, method: str, request: Any, **kw: Any) -> Any:
    fn = getattr(stub, method)
    if method in ("ListFiles", "History", "PlanVacuum"):
        return list(fn(request, timeout=30, **kw))
    return fn(request, timeout=30, **kw)


def _table_state(stub: pb_grpc.LakehouseServiceStub) -> tuple[Any, ...]:
    tables = stub.ListTables(pb.ListTablesRequest(catalog=CATALOG), timeout=30)
    history = _call(stub, "History", pb.HistoryRequest(catalog=CATALOG, table=TABLE))
    files = _call(stub, "ListFiles", pb.ListFilesRequest(catalog=CATALOG, table=TABLE))
    return (
        list(tables.tables),
        [e.SerializeToString(deterministic=True) for b in history for e in b.entries],
        [f.SerializeToString(deterministic=True) for b in files for f in b.files],
    )


def test_bad_requests_get_their_status_and_reason_and_change_nothing(
    tmp_path: Path, warehouse: str, servers: list[ServerProcess]
) -> None:
    gw = ServerProcess("all", sqlite_store(tmp_path), tmp_path).start()  # the installed build
    servers.append(gw)
    create_table(gw.address, warehouse)
    channel = grpc.insecure_channel(gw.address)
    stub = pb_grpc.LakehouseServiceStub(channel)
    try:
        before = _table_state(stub)
        wrong: list[str] = []
        for what, method, request, code, reason in BAD_REQUESTS:
            with pytest.raises(grpc.RpcError) as caught:
                _call(stub, method, request)
            err: Any = caught.value
            trailer = dict(err.trailing_metadata() or ())
            if err.code() != code or trailer.get(REASON_KEY) != reason:
                wrong.append(f"{what}: {err.code()} {trailer.get(REASON_KEY)!r} {err.details()}")
        assert wrong == []
        assert _table_state(stub) == before
        # The refused requests left no job mark behind: job-1 commits now, as version 1.
        reply = stub.CommitFiles(commit_request(GOOD_PATH, job_id="job-1"), timeout=30)
        assert (reply.version, reply.replayed, reply.group_size) == (1, False, 1)
        again = stub.CommitFiles(commit_request(GOOD_PATH, job_id="job-1"), timeout=30)
        assert (again.version, again.replayed) == (1, False)  # a resend, not a second version
        assert len(_table_state(stub)[1]) == 2
    finally:
        channel.close()


def test_a_token_protected_gateway_refuses_a_lakehouse_call_without_the_token(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    os.chmod(token_file, 0o600)
    gw = ServerProcess(
        "all", [*sqlite_store(tmp_path), "--token-file", str(token_file)], tmp_path
    ).start()
    servers.append(gw)
    channel = grpc.insecure_channel(gw.address)
    stub = pb_grpc.LakehouseServiceStub(channel)
    try:
        request = pb.ListTablesRequest(catalog=CATALOG)
        for metadata in [(), (("authorization", "Bearer wrong"),)]:
            with pytest.raises(grpc.RpcError) as caught:
                stub.ListTables(request, timeout=30, metadata=metadata)
            err: Any = caught.value
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert dict(err.trailing_metadata() or ()).get(REASON_KEY) == UNAUTHENTICATED
        ok = stub.ListTables(request, timeout=30, metadata=(("authorization", "Bearer s3cret"),))
        assert list(ok.tables) == []
    finally:
        channel.close()


def test_reflection_lists_the_lakehouse_service(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    gw = ServerProcess("all", sqlite_store(tmp_path), tmp_path).start()
    servers.append(gw)
    channel = grpc.insecure_channel(gw.address)
    try:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    finally:
        channel.close()
    assert "percolake.v1.LakehouseService" in services


# --- 6. the chaos workload's gateway clients -------------------------------------------


def test_the_chaos_workloads_gateway_clients_commit_through_the_service(
    tmp_path: Path, warehouse: str, servers: list[ServerProcess]
) -> None:
    """Its remote clients use the service, except slots 2, 6, ... (the client-driven
    catalog over the gateways' transaction service)."""
    gw = ServerProcess("all", sqlite_store(tmp_path), tmp_path).start()
    servers.append(gw)
    manager = FailoverManager([gw.address, gw.address], 0, 10.0)
    try:
        service = LakehouseAppends.open_lakehouse(manager, warehouse, 30.0, slot=0)
        assert isinstance(service, ServiceLakehouses)
        assert all(isinstance(h._catalog, RemoteCatalog) for h in service._houses)
        driven = LakehouseAppends.open_lakehouse(manager, warehouse, 30.0, slot=2)
        assert isinstance(driven._catalog, Catalog)
    finally:
        manager.close()
