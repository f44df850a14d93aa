"""Lakehouse commits with faults after the commit point, checked against a model.

Hypothesis interleaves appends (through the commit hook, with files written by
pyarrow instead of Spark, or through ``append_files``), overwrites, vacuums, and
faults: a follow-up step of the next commit fails (a catalog fail point, or the
follow-up transaction's ``begin`` or scan meeting a store error, a fenced oracle
or an unreachable gateway), or the next commit's outcome becomes unknown (its
commit point times out before or after applying, and settling may fail too).

After every step, the model's invariants hold (issue 12, hole 1):

* every file named by every readable version exists on disk, and each readable
  version lists exactly the files the model expects;
* versions are dense, and the latest is always readable;
* a call that returned a version made exactly that version visible, with its files;
* a replay of an (app_id, batch_id) that committed returns its first version and
  adds nothing;
* a call that raised a definite abort, or any error but ``CommitUnknownError``,
  added nothing (after the commit point nothing may be reported as failed).

Between them go garbage collection passes at retention 0 (issue 30), time travel by
timestamp, and readers that forget what they knew (the resolver's cache of outcomes
cleared, a fresh ``Lakehouse``), checked after every step too:

* once ``version_at(T)`` answered, it gives the same answer for ever (or says the
  version is no longer readable), and log times never decrease from one version to
  the next;
* a commit timestamp history showed never changes or goes, GC or not; an embedded
  catalog shows one for every version (a follow-up that failed to record it is made
  good from the transactions table or, once collected, the commit stamp).

Runs on embedded managers over memory and SQLite, and through a real
``percolake serve`` process. Faults inside the gateway cannot be armed from
here, so the remote variant injects them on the client side: the lakehouse's
catalog runs in the client, so its fail points work, and the client manager's
``begin`` is wrapped (``ClientFaults``) to fail follow-up transactions and to
lose commit replies.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pyspark.sql.types import LongType, StructField, StructType

import spark_integration.engine.checkpoints as checkpoints_module
from spark_integration import ConcurrentModificationError, DataFile, Lakehouse, VersionNotFoundError
from spark_integration.engine import Catalog
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.model import APPEND, OVERWRITE
from spark_integration.spark.hook import Job, new_job
from storage_adapters import KVStore, StoreTimeoutError, open_store
from tests.integration.test_lakehouse_post_commit import ERRORS, ClientFaults
from tests.servers import ServerProcess
from tso.timestamp_service import RemoteTimestampSource
from txn import GarbageCollector, TransactionConfig, TransactionManager
from txn import failpoints as txn_fp
from txn.errors import CommitUnknownError, TransactionAbortedError
from txn.remote import RemoteTransactionManager
from txn.tables import GC_TABLE, STATE_KEY, GcState

pytestmark = pytest.mark.property

TABLE = "t"
SCHEMA = StructType([StructField("id", LongType())])
CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=0)
ERROR_NAMES = sorted(ERRORS)
#: The gateway store's grace: what a pass beside the gateway waits before deleting.
GATEWAY_GRACE_MS = 100
#: Where a follow-up step of the next commit fails: a catalog fail point, or the
#: k-th transaction begun after the commit (commit_ts record, then checkpoint)
#: failing at ``begin`` or in its scans, from the client side.
FOLLOW_UP_FAULTS = [
    ("point", fp.AFTER_COMMIT_POINT),
    ("point", fp.BEFORE_RECORD_COMMIT_TS),
    ("point", fp.BEFORE_CHECKPOINT),
    ("point", fp.BEFORE_EXPIRE),
    ("begin", 1),
    ("begin", 2),
    ("scan", 2),
]

Manager = TransactionManager | RemoteTransactionManager
#: (app_id, batch_id), or (None, None) for a commit without one.
Key = tuple[str | None, int | None]


def _writer(
    rows: list[list[int]], written: list[str], jobs: list[Job]
) -> Callable[[Job, StructType, tuple[str, ...]], None]:
    """A commit hook writer: one Parquet file per batch of ids, in the job's folder."""

    def write(job: Job, schema: StructType, partition_by: tuple[str, ...]) -> None:
        jobs.append(job)
        Path(job.staging).mkdir(parents=True)
        for n, ids in enumerate(rows):
            path = Path(job.staging) / f"part-{n:05d}.parquet"
            pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
            written.append(str(path))

    return write


class LakehouseMachine(RuleBasedStateMachine):
    #: Set by each test: the folder for this run, and how to make a manager.
    workdir: ClassVar[Path]
    make_manager: ClassVar[Callable[[Path], Manager]]
    #: The gateway's store, which garbage collection opens beside it (remote only).
    gateway_store: ClassVar[str | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(dir=type(self).workdir))
        self.tm = type(self).make_manager(self.dir)
        if isinstance(self.tm, TransactionManager):
            # A grace of 0 before any reader leases the state row: passes need not wait.
            self.tm.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
        self.catalog = f"c{uuid.uuid4().hex[:12]}"
        self.lh = self._lakehouse()
        self.faults = ClientFaults(self.tm, self.lh.catalog)
        #: T -> the version ``version_at(T)`` answered (-1: the table was younger).
        self.answers: dict[int, int] = {}
        #: version -> the commit timestamp history showed for it.
        self.commit_tss: dict[int, int] = {}
        #: How far this process's clock is off: a committer behind the others.
        self.skew_ms = 0
        #: Files of every version, by absolute path; index = version.
        self.versions: list[frozenset[str]] = []
        #: (app_id, batch_id) -> the version its first commit made.
        self.batches: dict[Key, int] = {}
        self.tried_batches: list[Key] = []
        self.batch_ids = itertools.count()
        self.row_ids = itertools.count()
        self.armed: Callable[[], None] | None = None  # arms the next commit's fault
        self.unreadable_below = 0

    def _lakehouse(self) -> Lakehouse:
        house = Lakehouse(
            cast(TransactionManager, self.tm),  # a remote one is welcome too
            self.dir / "warehouse",
            catalog=self.catalog,
            commit_timeout_s=30,
            # The faults are injected into the catalog's own transactions, so it runs
            # here (over a gateway's transactions when the manager is remote).
            gateway_catalog=False,
        )
        catalog = house._catalog
        assert isinstance(catalog, Catalog)
        catalog.clock_ms = lambda: time.time_ns() // 1_000_000 + self.skew_ms
        return house

    def teardown(self) -> None:
        self.tm.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize()
    def create(self) -> None:
        self.lh.create_table(TABLE, SCHEMA)
        self.versions.append(frozenset())

    # --- faults --------------------------------------------------------------------

    @rule(where=st.sampled_from(FOLLOW_UP_FAULTS), error=st.sampled_from(ERROR_NAMES))
    def arm_a_follow_up_fault(self, where: tuple[str, Any], error: str) -> None:
        kind, at = where

        def arm() -> None:
            if kind == "point":
                self.lh.failpoints.enable(at, fp.raise_error(ERRORS[error]), times=1)
            else:
                self.faults.fail_follow_ups(*[None] * (at - 1), (kind, ERRORS[error]))

        self.armed = arm

    @rule(
        applied=st.booleans(),
        settle_fails=st.sampled_from([None, "point", "outcome"]),
        error=st.sampled_from(ERROR_NAMES),
    )
    def make_the_next_commit_outcome_unknown(
        self, applied: bool, settle_fails: str | None, error: str
    ) -> None:
        def arm() -> None:
            if isinstance(self.tm, TransactionManager):
                # The real commit point times out, before or after applying, and the
                # transaction layer's own settling keeps timing out: CommitUnknownError.
                points = self.tm.failpoints
                timeout = txn_fp.raise_error(lambda: StoreTimeoutError("timeout (injected)"))
                point = txn_fp.AFTER_COMMIT_POINT if applied else txn_fp.BEFORE_COMMIT_POINT
                points.enable(point, timeout, times=1)
                points.enable(txn_fp.SETTLE_COMMIT, timeout, times=CONFIG.settle_attempts)
            else:
                self.faults.lose_next_commit_reply(applied=applied)
            if settle_fails == "point":
                self.lh.failpoints.enable(fp.SETTLE_COMMIT, fp.raise_error(ERRORS[error]), times=1)
            elif settle_fails == "outcome":
                self.faults.fail_settle(ERRORS[error])

        self.armed = arm

    @contextlib.contextmanager
    def _faults_armed(self) -> Iterator[None]:
        armed, self.armed = self.armed, None
        if armed is not None:
            armed()
        try:
            yield
        finally:
            self.lh.failpoints.disable()
            if isinstance(self.tm, TransactionManager):
                self.tm.failpoints.disable()
            self.faults.reset()

    # --- writes --------------------------------------------------------------------

    def _batch(self, data: st.DataObject, kind: str) -> Key:
        if kind == "replay" and self.tried_batches:
            return data.draw(st.sampled_from(self.tried_batches))
        if kind == "none":
            return None, None
        key: Key = (data.draw(st.sampled_from(["app-a", "app-b"])), next(self.batch_ids))
        self.tried_batches.append(key)
        return key

    def _rows(self, n_files: int) -> list[list[int]]:
        return [[next(self.row_ids) for _ in range(1 + i % 2)] for i in range(n_files)]

    def _commit(
        self,
        operation: str,
        key: Key,
        call: Callable[[], int],
        written: list[str],
        *,
        staged: Callable[[], Path | None] = lambda: None,
    ) -> None:
        before = len(self.versions) - 1
        first = self.batches.get(key) if key[0] is not None else None
        got: int | None = None
        outcome = "ok"
        with self._faults_armed():
            try:
                got = call()
            except TransactionAbortedError:
                outcome = "abort"
            except CommitUnknownError:
                outcome = "unknown"
            except Exception as exc:
                outcome = f"error {exc!r}"
        head = self.lh.version(TABLE)
        event(f"{operation.lower()}: {outcome.split('(')[0]}")
        if first is not None:
            assert (outcome, got, head) == ("ok", first, before), "a replay must change nothing"
            return
        missing: list[str] = []
        if head == before + 1:
            files = frozenset(written)
            self.versions.append(files if operation == OVERWRITE else self.versions[-1] | files)
            if key[0] is not None:
                self.batches[key] = head
            missing = sorted(p for p in written if not os.path.exists(p))
        if outcome == "ok":
            assert got == before + 1 == head, f"returned {got}, head {head}, was {before}"
        elif outcome == "unknown":
            assert head in (before, before + 1)
        else:
            # A definite abort, or any failure that is not "unknown": nothing committed.
            assert head == before, (
                f"{outcome} reported, yet version {head} committed "
                f"(and names {len(missing)} deleted files of its {len(written)})"
            )
            job = staged()
            if outcome == "abort" and job is not None:
                assert not job.exists(), "a definite abort leaves no job folder"

    def _hook(self, operation: str, rows: list[list[int]], key: Key) -> None:
        """``append``/``overwrite``'s own path, with pyarrow writing the job's files."""
        written: list[str] = []
        jobs: list[Job] = []
        write = _writer(rows, written, jobs)
        self._commit(
            operation,
            key,
            lambda: self.lh._run_job(operation, TABLE, SCHEMA, write, *key),
            written,
            staged=lambda: jobs[0].staging if jobs else None,
        )

    @rule(
        data=st.data(),
        via=st.sampled_from(["hook", "append_files"]),
        n_files=st.integers(1, 2),
        batch=st.sampled_from(["none", "new", "replay"]),
    )
    def append(self, data: st.DataObject, via: str, n_files: int, batch: str) -> None:
        key = self._batch(data, batch)
        rows = self._rows(n_files)
        if via == "hook":
            self._hook(APPEND, rows, key)
            return
        written: list[str] = []
        _writer(rows, written, [])(new_job(os.path.join(self.lh.warehouse, TABLE)), SCHEMA, ())
        files = [DataFile(p, os.path.getsize(p), pq.read_metadata(p).num_rows) for p in written]
        self._commit(
            APPEND,
            key,
            lambda: self.lh.append_files(TABLE, files, app_id=key[0], batch_id=key[1]),
            [f.path for f in files],
        )

    @rule(data=st.data(), batch=st.sampled_from(["none", "new", "replay"]))
    def overwrite(self, data: st.DataObject, batch: str) -> None:
        self._hook(OVERWRITE, self._rows(1), self._batch(data, batch))

    @rule()
    def append_racing_a_vacuum(self) -> None:
        """A vacuum fences the job between its write and its commit: a definite abort."""

        def vacuum(job_id: str) -> None:
            time.sleep(0.002)  # a cutoff in the job's own millisecond would not fence it
            self.lh.vacuum(TABLE, retain_seconds=0)

        self.lh.failpoints.enable(fp.BEFORE_COMMIT, vacuum, times=1)
        before = len(self.versions) - 1
        write = _writer(self._rows(1), [], [])
        try:
            with pytest.raises(ConcurrentModificationError, match="vacuum"):
                self.lh._run_job(APPEND, TABLE, SCHEMA, write, None, None)
        finally:
            self.lh.failpoints.disable()
        assert self.lh.version(TABLE) == before

    @rule(retain_seconds=st.sampled_from([0, 3600]))
    def vacuum(self, retain_seconds: int) -> None:
        self.lh.vacuum(TABLE, retain_seconds)

    # --- garbage collection, time travel, forgetting (issue 30) ----------------------

    @rule()
    def collect_garbage(self) -> None:
        """A pass at retention 0: every entry below its safe point is stamped and goes."""
        store: KVStore
        if isinstance(self.tm, TransactionManager):
            store = self.tm.store
            collector = GarbageCollector(
                store,
                timestamps=self.tm._rt.timestamps,
                locks=self.tm.locks,
                retention_s=0,
                grace_ms=0,
                config=CONFIG,
            )
            collector.run_once()
            return
        # Beside the gateway, on its store, with timestamps from its oracle.
        assert self.gateway_store is not None
        store = open_store(self.gateway_store)
        try:
            GarbageCollector(
                store,
                timestamps=RemoteTimestampSource(self.tm.connection),
                retention_s=0,
                grace_ms=GATEWAY_GRACE_MS,
                config=CONFIG,
            ).run_once()
        finally:
            store.close()

    @rule(skew_ms=st.sampled_from([0, -20, -2_000, 2_000]))
    def skew_the_clock(self, skew_ms: int) -> None:
        """The next commits and answers come from a process whose clock is off."""
        self.skew_ms = skew_ms

    @rule()
    def forget(self) -> None:
        """A reader in another process: no remembered outcomes, no cached metadata."""
        if isinstance(self.tm, TransactionManager):
            self.tm._rt.resolver.clear_cache()
        self.lh = self._lakehouse()

    @rule(again=st.booleans(), pick=st.integers(0, 63), back_ms=st.integers(0, 30))
    def travel(self, again: bool, pick: int, back_ms: int) -> None:
        """``version_at`` a time just past, or one asked before: the same answer.

        Everything is drawn up front: what happens next depends on the clock, and
        Hypothesis needs the same draws whatever the clock said.
        """
        asked = sorted(self.answers)
        at = asked[pick % len(asked)] if again and asked else time.time_ns() // 1_000_000 - back_ms
        try:
            got = self.lh.version_at(TABLE, at)
        except VersionNotFoundError as exc:
            if "future" in str(exc):  # by this process's clock, when it is behind
                assert self.skew_ms < 0, exc
                return
            if "created after" not in str(exc):
                # Vacuum took the version as of then: no answer, never another one.
                assert self.answers.get(at, -1) < len(self.versions) - 1, exc
                return
            got = -1
        first = self.answers.setdefault(at, got)
        assert got == first, f"version_at({at}) answered {first}, now {got}"

    # --- invariants ----------------------------------------------------------------

    @precondition(lambda self: bool(self.versions))
    @invariant()
    def time_travel_and_commit_timestamps_hold(self) -> None:
        history = self.lh.history(TABLE)
        times = [c.timestamp_ms for c in history]
        assert times == sorted(times), f"log times go backwards: {times}"
        for at, answer in self.answers.items():
            newest = max((c.version for c in history if c.timestamp_ms <= at), default=-1)
            assert newest == answer, f"version_at({at}) answered {answer}, the log says {newest}"
        for c in history:
            if c.commit_ts is None:
                assert not isinstance(self.tm, TransactionManager), (
                    f"version {c.version} has no commit timestamp in an embedded catalog"
                )
                assert c.version not in self.commit_tss, f"version {c.version} lost its commit_ts"
            else:
                known = self.commit_tss.setdefault(c.version, c.commit_ts)
                assert c.commit_ts == known, f"version {c.version}'s commit_ts changed"

    @precondition(lambda self: bool(self.versions))
    @invariant()
    def every_readable_version_is_whole_on_disk(self) -> None:
        head = len(self.versions) - 1
        assert self.lh.version(TABLE) == head
        assert [c.version for c in self.lh.history(TABLE)] == list(range(head + 1))
        for version in range(self.unreadable_below, head + 1):
            try:
                files = self.lh.files(TABLE, version)
            except VersionNotFoundError:
                assert version < head, "the latest version must stay readable"
                self.unreadable_below = version + 1
                continue
            paths = {f.path for f in files}
            assert paths == self.versions[version], f"version {version} lists other files"
            missing = sorted(p for p in paths if not os.path.exists(p))
            assert not missing, f"version {version} names deleted files: {missing}"


SETTINGS = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(autouse=True)
def frequent_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint every other version, in chunks of two files: the follow-up runs often."""
    monkeypatch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", 2)
    monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 2)


def _run(
    workdir: Path,
    make: Callable[[Path], Manager],
    run_settings: settings,
    gateway_store: str | None = None,
) -> None:
    class Machine(LakehouseMachine):
        pass

    Machine.workdir = workdir
    Machine.make_manager = staticmethod(make)
    Machine.gateway_store = gateway_store
    run_state_machine_as_test(Machine, settings=run_settings)


@pytest.mark.integration
def test_lakehouse_through_a_gateway(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/gw.db"
    store = open_store(url)  # a short grace before the gateway leases the state row
    store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=GATEWAY_GRACE_MS).encode())
    store.close()
    server = ServerProcess("all", ["--store", url], tmp_path).start()
    try:
        _run(
            tmp_path,
            lambda _: TransactionManager.remote(server.address),
            settings(SETTINGS, max_examples=15, stateful_step_count=20),
            gateway_store=url,
        )
    finally:
        server.stop()


def test_lakehouse_on_memory(tmp_path: Path) -> None:
    _run(tmp_path, lambda _: TransactionManager.embedded("memory://", config=CONFIG), SETTINGS)


def test_lakehouse_on_sqlite(tmp_path: Path) -> None:
    _run(
        tmp_path,
        lambda d: TransactionManager.embedded(f"sqlite:///{d}/store.db", config=CONFIG),
        settings(SETTINGS, max_examples=25),
    )
