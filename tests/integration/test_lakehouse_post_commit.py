"""After the commit point nothing is undone (issue 12, hole 1).

A lakehouse commit is one transaction; what follows it (recording its commit
timestamp, a checkpoint) and what settles an unknown outcome are further
transactions that can fail on their own: a store timeout, a fenced oracle, an
unreachable gateway. Such a failure must never be reported as a failed commit,
and must never delete the files of a version that committed.

Every test runs through a real ``percolake serve`` process first (the deployed
topology) and then on embedded managers. Faults come from the client side, the
only side a test can reach in a separate gateway: the manager's ``begin`` is
wrapped (:class:`ClientFaults`) so that the transactions a commit begins after its
own fail as the issue describes. On embedded managers the checkpoint's scan
fails inside the real store instead. Files are small Parquet files written with
pyarrow and committed by ``append_files``; one Spark test covers ``append``,
the only path that deletes a job's files. That test runs on a local warehouse and on
``s3://`` on the session's MinIO (``warehouse`` in tests/conftest.py), where deleting
a job's files means deleting objects by prefix; the others test the catalog's
outcomes, which no store changes, on a local folder.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

import spark_integration.engine.checkpoints as checkpoints_module
from spark_integration import ConcurrentModificationError, DataFile, Lakehouse
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.locations import join
from spark_integration.engine.model import Layout
from spark_integration.spark import filesystem
from spark_integration.spark.hook import new_job
from storage_adapters import StoreError, StoreTimeoutError
from tests.servers import ServerProcess
from tso import OracleFencedError
from txn import TransactionConfig, TransactionManager
from txn import failpoints as txn_fp
from txn.errors import CommitUnknownError, TransactionError
from txn.remote import RemoteTransactionManager
from wire.error_codes import ServiceUnavailableError

pytestmark = pytest.mark.integration

TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)
SCHEMA = StructType([StructField("id", LongType())])
MANAGERS = ["remote-sqlite", "sqlite", "memory"]

#: Catalog outcomes only: the store of the files makes no difference.
LOCAL = pytest.mark.parametrize("warehouse", ["local"], indirect=True)

Manager = TransactionManager | RemoteTransactionManager
Error = Callable[[], BaseException]

#: The errors the issue names: ``tm.begin()`` or a read failing with them.
ERRORS: dict[str, Error] = {
    "store-timeout": lambda: StoreTimeoutError("read timed out (injected)"),
    "store": lambda: StoreError("store unreachable (injected)"),
    "oracle-fenced": lambda: OracleFencedError("oracle fenced (injected)"),
    "unavailable": lambda: ServiceUnavailableError(
        "gateway unreachable (injected)", code=grpc.StatusCode.UNAVAILABLE, reason="unavailable"
    ),
}


class ClientFaults:
    """Faults in the transactions that a lakehouse commit begins after its own.

    Wraps ``begin`` of one manager instance, embedded or remote alike. The commit
    transaction is recognised by the log record it writes; once its commit has
    returned (or ended in an unknown outcome), the transactions begun after it are
    its follow-ups (recording commit_ts, a checkpoint) or the reads that settle
    it, and the i-th of them meets the i-th armed fault: ``("begin", error)``
    makes ``begin`` raise, ``("scan", error)`` makes the transaction's scans
    raise, ``None`` lets it pass. :meth:`lose_next_commit_reply` makes the next
    commit transaction end in ``CommitUnknownError`` after it did (or did not)
    commit, as a lost reply does. :meth:`fail_settle` makes the next settling of an
    unknown outcome (the manager's ``outcome(..., settle=True)``) raise.
    """

    def __init__(self, tm: Manager, catalog: str) -> None:
        self._real_begin = tm.begin
        self._log_table = Layout(catalog).log
        self._follow_ups: list[tuple[str, Error] | None] = []
        self._after_commit = False
        self._lose_reply: bool | None = None
        self._settle_error: Error | None = None
        self.injected: list[str] = []
        tm.begin = self._begin  # type: ignore[method-assign]
        self._real_outcome = tm.outcome
        tm.outcome = self._outcome  # type: ignore[method-assign]

    def fail_settle(self, error: Error) -> None:
        self._settle_error = error

    def _outcome(self, txn_id: str, *, settle: bool = False) -> Any:
        error, self._settle_error = self._settle_error, None
        if settle and error is not None:
            self.injected.append("settle")
            raise error()
        return self._real_outcome(txn_id, settle=settle)

    def fail_follow_ups(self, *faults: tuple[str, Error] | None) -> None:
        self._follow_ups = list(faults)
        self._after_commit = False

    def lose_next_commit_reply(self, *, applied: bool) -> None:
        self._lose_reply = applied
        self._after_commit = False

    def reset(self) -> None:
        """Disarm whatever was armed and not met."""
        self._follow_ups = []
        self._lose_reply = None
        self._settle_error = None
        self._after_commit = False

    def _begin(self, *args: Any, **kwargs: Any) -> Any:
        if self._after_commit and self._follow_ups:
            fault = self._follow_ups.pop(0)
            if fault is not None:
                where, error = fault
                if where == "begin":
                    self.injected.append("begin")
                    raise error()
                tx: Any = self._real_begin(*args, **kwargs)

                def failing_scan(*_: Any, **__: Any) -> Any:
                    self.injected.append("scan")
                    raise error()

                tx.scan = failing_scan
                return tx
        tx = self._real_begin(*args, **kwargs)
        self._watch(tx)
        return tx

    def _watch(self, tx: Any) -> None:
        real_put, real_commit = tx.put, tx.commit
        wrote_record = False

        def put(table: str, row: bytes, column: bytes, value: bytes) -> None:
            nonlocal wrote_record
            if table == self._log_table and column == Layout.COL_RECORD:
                wrote_record = True
            real_put(table, row, column, value)

        def commit() -> int:
            if not wrote_record:
                return int(real_commit())
            lose, self._lose_reply = self._lose_reply, None
            if lose is None:
                try:
                    commit_ts = int(real_commit())
                except CommitUnknownError:
                    self._after_commit = True  # the settling reads come next
                    raise
                self._after_commit = True
                return commit_ts
            if lose:
                real_commit()
            else:
                tx.abort()
            self._after_commit = True
            self.injected.append("lost reply")
            raise CommitUnknownError("commit reply lost (injected)", start_ts=tx.start_ts)

        tx.put = put
        tx.commit = commit


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``percolake serve`` for the module; each test has a catalog of its own."""
    workdir = tmp_path_factory.mktemp("gateway")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/gw.db"], workdir).start()
    yield server
    server.stop()


@pytest.fixture(params=MANAGERS)
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Manager]:
    kind: str = request.param
    tm: Manager
    if kind == "remote-sqlite":
        tm = TransactionManager.remote(request.getfixturevalue("gateway").address)
    else:
        url = "memory://" if kind == "memory" else f"sqlite:///{tmp_path}/store.db"
        tm = TransactionManager.embedded(url, config=TEST_CONFIG)
    yield tm
    tm.close()


@pytest.fixture
def lh(manager: Manager, warehouse: str) -> Lakehouse:
    house = Lakehouse(
        cast(TransactionManager, manager),  # a remote one is welcome too
        warehouse,
        catalog=f"c{uuid.uuid4().hex[:12]}",
        # The catalog's own transactions are what these tests break, so it runs
        # here, over the gateway's transactions; the gateway's lakehouse service
        # (where it runs by default) has its tests in test_lakehouse_service.py.
        gateway_catalog=False,
    )
    house.create_table("t", SCHEMA)
    house.schema("t")  # cache the metadata: the transactions counted below are the commit's
    return house


@pytest.fixture
def faults(manager: Manager, lh: Lakehouse) -> ClientFaults:
    return ClientFaults(manager, lh.catalog)


def is_remote(tm: Manager) -> bool:
    return isinstance(tm, RemoteTransactionManager)


def write_job(lh: Lakehouse, *batches: list[int]) -> list[DataFile]:
    """One Parquet file per batch of ids, in a fresh job folder of table ``t``."""
    job = new_job(join(lh.warehouse, "t"))
    filesystem.make_dirs(job.staging)
    files = []
    for n, ids in enumerate(batches):
        path = join(job.staging, f"part-{n:05d}.parquet")
        fs, fs_path = filesystem.resolve(path)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), fs_path, filesystem=fs)
        files.append(DataFile(path, filesystem.file_size(path), len(ids)))
    return files


def ids_of_version(lh: Lakehouse, version: int) -> list[int]:
    """The rows of ``version``, read from the files it names (no Spark needed)."""
    return sorted(
        i
        for f in lh.files("t", version)
        for i in filesystem.parquet_file(f.path).read().column("id").to_pylist()
    )


def fail_next_scan_in_store(
    monkeypatch: pytest.MonkeyPatch, tm: TransactionManager, table: str, error: Error
) -> list[str]:
    """The store's next scan of ``table`` fails: a read timeout inside a real transaction."""
    store = tm.store
    real_scan = store.scan
    fired: list[str] = []

    def scan(scanned: str, *args: Any, **kwargs: Any) -> Any:
        if scanned == table and not fired:
            fired.append(scanned)
            raise error()
        return real_scan(scanned, *args, **kwargs)

    monkeypatch.setattr(store, "scan", scan)
    return fired


# --- regression tests -----------------------------------------------------------------


@LOCAL
@pytest.mark.parametrize("where", ["store", "scan"])
def test_a_store_error_in_the_checkpoint_after_a_good_commit_keeps_the_version(
    manager: Manager,
    lh: Lakehouse,
    faults: ClientFaults,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """Fails before the fix (``scan``): ``append_files`` raised the store's error (and
    ``append`` deleted the files) although the version had committed.

    Interleaving: the commit transaction commits version 1; commit_ts is recorded;
    the checkpoint due at version 1 begins and its scan of the files fails with a
    read timeout, which escaped ``_checkpoint`` because it caught only
    ``TransactionError``. ``scan``: the transaction's scan raises the raw
    ``StoreTimeoutError``, as ``Transaction.scan`` let it through before it learned
    to wrap it (the catalog must not depend on that). ``store``: the timeout comes
    from inside the embedded store, or as the gateway's ``ServiceUnavailableError``
    through a remote manager, whatever the transaction layer makes of it.
    """
    monkeypatch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", 1)  # every version
    files = write_job(lh, [1, 2], [3])
    fired = faults.injected
    if where == "scan":
        faults.fail_follow_ups(None, ("scan", ERRORS["store-timeout"]))
    elif isinstance(manager, TransactionManager):
        layout = Layout(lh.catalog)
        fired = fail_next_scan_in_store(monkeypatch, manager, layout.files, ERRORS["store-timeout"])
    else:
        faults.fail_follow_ups(None, ("scan", ERRORS["unavailable"]))
    assert lh.append_files("t", files) == 1
    assert fired, "the fault was not injected"
    assert all(filesystem.exists(f.path) for f in files)
    assert ids_of_version(lh, 1) == [1, 2, 3]
    # The table goes on: the next commit is version 2, and it checkpoints.
    assert lh.append_files("t", write_job(lh, [4])) == 2
    assert ids_of_version(lh, 2) == [1, 2, 3, 4]


@LOCAL
@pytest.mark.parametrize("error", ["oracle-fenced", "store", "unavailable"])
def test_a_failed_commit_ts_record_after_a_good_commit_keeps_the_version(
    manager: Manager, lh: Lakehouse, faults: ClientFaults, error: str
) -> None:
    """Fails before the fix: the error of the follow-up ``tm.begin()`` escaped from
    ``commit_files``, so the caller saw a failed commit of a version that stands (and
    a retry without app_id/batch_id would append the files twice).

    Interleaving: the commit transaction commits version 1; ``_record_commit_ts``
    calls ``tm.begin()``, which raises ``OracleFencedError``, ``StoreError`` or
    ``ServiceUnavailableError``; ``_record_commit_ts`` caught only ``TransactionError``.
    """
    files = write_job(lh, [7, 8])
    faults.fail_follow_ups(("begin", ERRORS[error]))
    assert lh.append_files("t", files) == 1
    assert faults.injected == ["begin"]
    assert all(filesystem.exists(f.path) for f in files)
    assert ids_of_version(lh, 1) == [7, 8]
    history = lh.history("t")
    assert [c.version for c in history] == [0, 1]
    # The one thing the failed follow-up costs, where the catalog cannot reach the
    # store: an embedded catalog finds it in the transactions table (or the stamp).
    assert (history[1].commit_ts is None) == is_remote(manager)
    assert lh.append_files("t", write_job(lh, [9])) == 2


def _lose_commit_reply(
    manager: Manager, faults: ClientFaults, *, applied: bool
) -> Callable[[], None]:
    """The next commit transaction ends in ``CommitUnknownError``; returns the undo.

    Embedded: the real commit point times out (before or after applying) and the
    transaction layer's own settling keeps timing out. Remote: the reply is lost
    on the client side.
    """
    if is_remote(manager):
        faults.lose_next_commit_reply(applied=applied)
        return lambda: None
    assert isinstance(manager, TransactionManager)
    points = manager.failpoints
    point = txn_fp.AFTER_COMMIT_POINT if applied else txn_fp.BEFORE_COMMIT_POINT
    timeout = txn_fp.raise_error(lambda: StoreTimeoutError("commit point timed out (injected)"))
    points.enable(point, timeout, times=1)
    points.enable(txn_fp.SETTLE_COMMIT, timeout)
    return points.disable


@LOCAL
@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
@pytest.mark.parametrize("error", ["oracle-fenced", "store", "unavailable"])
def test_settling_that_fails_with_any_error_raises_commit_unknown_and_keeps_the_files(
    manager: Manager, lh: Lakehouse, faults: ClientFaults, error: str, applied: bool
) -> None:
    """Fails before the fix: the settle's own error (not a ``TransactionError``) escaped
    the catalog's retry loop (now ``TableAccess.transact``) in place of
    ``CommitUnknownError``, so ``append`` took it for "not committed" and deleted files
    that a committed version may name.

    Interleaving: the commit transaction's outcome is unknown (its commit point timed
    out, before or after applying, and could not be settled); the catalog settles it
    (then by reading the log back, now by the manager's fencing ``outcome``) and that
    raises. Afterwards a retry with the same (app_id, batch_id) finds the truth: the
    first version, or a fresh one.
    """
    files = write_job(lh, [5, 6])
    undo = _lose_commit_reply(manager, faults, applied=applied)
    faults.fail_settle(ERRORS[error])
    with pytest.raises(CommitUnknownError):
        lh.append_files("t", files, app_id="job", batch_id=1)
    undo()
    assert "settle" in faults.injected
    assert all(filesystem.exists(f.path) for f in files)
    assert lh.version("t") == (1 if applied else 0)
    assert lh.append_files("t", files, app_id="job", batch_id=1) == 1
    assert lh.version("t") == 1
    assert ids_of_version(lh, 1) == [5, 6]


@LOCAL
def test_a_commit_still_on_its_way_cannot_land_after_the_catalog_settled_it(
    manager: Manager, lh: Lakehouse
) -> None:
    """Issue 12, hole 4, as the catalog meets it; failed before the fix (two versions).

    Interleaving: the append's Commit is still on its way (queued at the gateway, or
    its request not yet sent) when the client gives up waiting: CommitUnknownError.
    The catalog settled it by reading the log back: nothing there, "not committed".
    Then the queued Commit landed (version 1), and the catalog's retry appended the
    same files again as version 2. Now the catalog settles through the manager's
    fencing ``outcome(settle=True)``: the late Commit fails, and the files are in
    exactly one version.
    """
    files = write_job(lh, [1, 2])
    real_begin = manager.begin
    real_outcome = manager.outcome
    held: list[Any] = []
    landed: list[object] = []
    settled = [False]

    def land() -> None:
        if held:
            stale = held.pop()
            try:
                landed.append(stale.commit())  # the queued Commit arrives after all
            except TransactionError as exc:
                landed.append(exc)

    def begin(*args: Any, **kwargs: Any) -> Any:
        if settled[0]:
            land()  # the Commit lands just after the settle, before the retry
        tx = real_begin(*args, **kwargs)
        real_put, real_commit = tx.put, tx.commit
        wrote = [False]

        def put(*a: Any) -> None:
            wrote[0] = True
            real_put(*a)

        def commit() -> Any:
            if wrote[0] and not held and not landed:
                held.append(SimpleNamespace(commit=real_commit))
                raise CommitUnknownError("no reply yet (injected)", start_ts=tx.start_ts)
            result = real_commit()
            if not wrote[0]:
                land()  # a read-only transaction (reading the log back) just ended
            return result

        tx.put, tx.commit = put, commit
        return tx

    def outcome(txn_id: str, *, settle: bool = False) -> Any:
        got = real_outcome(txn_id, settle=settle)
        settled[0] = settled[0] or settle
        return got

    manager.begin = begin  # type: ignore[method-assign]
    manager.outcome = outcome  # type: ignore[method-assign]
    try:
        version = lh.append_files("t", files)
    finally:
        manager.begin = real_begin  # type: ignore[method-assign]
        manager.outcome = real_outcome  # type: ignore[method-assign]
    assert len(landed) == 1 and isinstance(landed[0], TransactionError), landed
    assert version == 1
    assert lh.version("t") == 1
    assert ids_of_version(lh, 1) == [1, 2]


# --- the Spark path, the only one that deletes a job's files --------------------------

SPARK_FAULTS = ["commit-ts", "checkpoint", "settle", "stale-overwrite"]


@pytest.mark.spark
@pytest.mark.parametrize("fault", SPARK_FAULTS)
@pytest.mark.parametrize(
    ("manager", "warehouse"),
    [
        ("remote-sqlite", "local"),
        ("sqlite", "local"),
        pytest.param("sqlite", "s3", marks=pytest.mark.s3),
    ],
    indirect=True,
)
def test_spark_append_deletes_its_files_only_when_nothing_committed(
    manager: Manager,
    lh: Lakehouse,
    faults: ClientFaults,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    """Fails before the fix for ``commit-ts``, ``checkpoint`` and ``settle``: ``append``
    removed the job folder on the follow-up's error, leaving version 1 naming deleted
    files (reading it failed), and raised although version 1 had committed.

    Interleavings: Spark writes the files; the commit transaction commits version 1
    (or its reply is lost); then ``commit-ts``: ``tm.begin()`` of the commit_ts record
    raises ``OracleFencedError``; ``checkpoint``: the checkpoint's scan fails;
    ``settle``: settling the unknown outcome raises a raw ``StoreError``.
    ``stale-overwrite`` is the control: another commit lands while an overwrite's job
    runs, a definite abort (``ConcurrentModificationError``), so its files go at once.
    """
    monkeypatch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", 1)
    df = spark.createDataFrame([(i,) for i in range(4)], SCHEMA)
    location = join(lh.warehouse, "t")
    if fault == "stale-overwrite":
        other = write_job(lh, [9])

        def commit_another(job_id: str) -> None:
            lh.append_files("t", other)

        lh.failpoints.enable(fp.BEFORE_COMMIT, commit_another, times=1)
        with pytest.raises(ConcurrentModificationError):
            lh.overwrite("t", df)
        jobs = [p for p in filesystem.list_dirs(location) if "/_lh_job=" in p]
        assert jobs == [other[0].path.rsplit("/", 1)[0]]  # the overwrite's own folder is gone
        assert ids_of_version(lh, 1) == [9]
        return
    if fault == "commit-ts":
        faults.fail_follow_ups(("begin", ERRORS["oracle-fenced"]))
    elif fault == "checkpoint":
        faults.fail_follow_ups(None, ("scan", ERRORS["store-timeout"]))
    else:
        undo = _lose_commit_reply(manager, faults, applied=True)
        faults.fail_settle(ERRORS["store"])
    if fault == "settle":
        with pytest.raises(CommitUnknownError):
            lh.append("t", df)
        undo()
    else:
        assert lh.append("t", df) == 1
    assert faults.injected
    assert lh.version("t") == 1
    assert all(filesystem.exists(f.path) for f in lh.files("t", 1))
    got = sorted(r["id"] for r in lh.read(spark, "t", version=1).collect())
    assert got == [0, 1, 2, 3]
