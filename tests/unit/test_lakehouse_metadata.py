"""The lakehouse metadata layer without Spark: commits, races, time travel, vacuum.

Files here are metadata only (``append_files``), or small stand-ins on disk for
vacuum; no Spark session is started, so these run in the fast tier. The catalog
logic runs on a local warehouse (``LOCAL``); the vacuum fence that dates a job by
its folder's name also runs on ``s3://`` on the session's MinIO (marked ``s3``, so
the fast tier, which leaves servers out, runs only its local half).
"""

from __future__ import annotations

import bisect
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import LongType, StringType, StructField, StructType

import spark_integration
import spark_integration.engine.checkpoints as checkpoints_module
from spark_integration import (
    Commit,
    ConcurrentModificationError,
    DataFile,
    Lakehouse,
    TableNotFoundError,
    VersionNotFoundError,
)
from spark_integration.engine import Catalog
from spark_integration.engine.locations import is_object_store, join
from spark_integration.engine.model import APPEND, OVERWRITE, FileEntry, Layout
from spark_integration.spark import filesystem
from spark_integration.spark.hook import STAGING_PREFIX, job_started_ms, new_job, parse_partition
from spark_integration.spark.vacuum_sweep import sweep
from storage_adapters import StoreTimeoutError
from txn import EmbeddedTransaction, Transaction, TransactionConfig, TransactionManager
from txn import failpoints as txn_fp
from txn.errors import CommitUnknownError, TransactionConflictError, TransactionError

pytestmark = pytest.mark.unit

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)

#: Catalog logic only (the files are metadata, never written): one store is enough.
LOCAL = pytest.mark.parametrize("warehouse", ["local"], indirect=True)
#: The vacuum fence dated by job folder names: on a local folder and on MinIO.
BOTH_STORES = ["local", pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture(params=["memory", "sqlite"])
def lakehouse_tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"
    manager = TransactionManager.embedded(url, config=TEST_CONFIG)
    yield manager
    manager.close()


@pytest.fixture
def lh(lakehouse_tm: TransactionManager, warehouse: str) -> Lakehouse:
    house = Lakehouse(lakehouse_tm, warehouse)
    house.create_table("t", SCHEMA, partition_by="day")
    return house


def data_file(lh: Lakehouse, n: int, day: str = "d1", job: str = "job") -> DataFile:
    path = f"{lh.warehouse}/t/{STAGING_PREFIX}{job}/day={day}/part-{n:06d}.parquet"
    return DataFile(path, size_bytes=100 + n, record_count=n, partition={"day": day})


def run_threads(*targets: Callable[[], Any]) -> list[Any]:
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def wrap(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i, t)) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def test_public_exports() -> None:
    assert set(spark_integration.__all__) == {
        "ChangeCommitError",
        "ColumnStats",
        "Commit",
        "ConcurrentModificationError",
        "DataFile",
        "DmlResult",
        "ExpireResult",
        "Lakehouse",
        "LakehouseError",
        "PercolakeDataSource",
        "Retention",
        "TableExistsError",
        "TableNotFoundError",
        "VersionNotFoundError",
        "VersionVacuumedError",
        "register",
        "s3a_conf",
        "write_cells",
    }
    assert issubclass(ConcurrentModificationError, TransactionConflictError)
    assert issubclass(TableNotFoundError, spark_integration.LakehouseError)


@LOCAL
@pytest.mark.parametrize("drivers", ["one Lakehouse", "a Lakehouse each"])
def test_eight_blind_appenders_never_fail(
    lakehouse_tm: TransactionManager, lh: Lakehouse, drivers: str
) -> None:
    """Threads of one Lakehouse take turns; separate ones (as separate drivers would)
    race through the transaction protocol and retry at the head."""
    writers, each = 8, 15
    houses = [
        lh if drivers == "one Lakehouse" else Lakehouse(lakehouse_tm, lh.warehouse)
        for _ in range(writers)
    ]

    def writer(w: int) -> list[int]:
        return [houses[w].append_files("t", [data_file(lh, 1000 * w + k)]) for k in range(each)]

    got = run_threads(*[lambda w=w: writer(w) for w in range(writers)])
    assert sorted(v for vs in got for v in vs) == list(range(1, writers * each + 1))
    files = lh.files("t")
    assert len(files) == writers * each
    assert len({f.path for f in files}) == writers * each
    # Each version added exactly its one file, in version order.
    history = lh.history("t")[1:]
    assert [c.version for c in history] == list(range(1, writers * each + 1))
    assert [c.added_files[0] for c in history] == [f.path for f in files]


@LOCAL
def test_append_that_loses_the_head_retries_on_the_new_version(
    lakehouse_tm: TransactionManager, lh: Lakehouse, caplog: pytest.LogCaptureFixture
) -> None:
    """A commits while B's transaction already read the head: B conflicts, retries, wins v2."""
    caplog.set_level(logging.DEBUG, logger="txn._retry")
    a, b = Lakehouse(lakehouse_tm, lh.warehouse), Lakehouse(lakehouse_tm, lh.warehouse)
    a_locked, release_a, b_read = threading.Event(), threading.Event(), threading.Event()
    lakehouse_tm.failpoints.enable(
        txn_fp.AFTER_LOCK, txn_fp.pause(30, until=release_a, reached=a_locked), times=1
    )
    assert isinstance(b._catalog, Catalog)
    # A commit reads its head together with its job marks (GroupAttempt.run).
    read_head_with = b._catalog.tables.read_head_with

    def read_head_then_signal(tx: Transaction, name: str, *args: Any) -> Any:
        got = read_head_with(tx, name, *args)
        b_read.set()
        return got

    b._catalog.tables.read_head_with = read_head_then_signal  # type: ignore[method-assign]

    def commit_b() -> int:
        assert a_locked.wait(30)
        return b.append_files("t", [data_file(lh, 2)])

    def release_once_b_read() -> None:
        assert b_read.wait(30)
        release_a.set()

    got = run_threads(
        lambda: a.append_files("t", [data_file(lh, 1)]), commit_b, release_once_b_read
    )
    assert got[:2] == [1, 2]
    assert "attempt 1 did not commit" in caplog.text
    assert [f.record_count for f in lh.files("t")] == [1, 2]


@LOCAL
def test_racing_replays_of_one_batch_commit_once(
    lakehouse_tm: TransactionManager, lh: Lakehouse
) -> None:
    start = threading.Barrier(6, timeout=60)
    houses = [Lakehouse(lakehouse_tm, lh.warehouse) for _ in range(6)]

    def replay(n: int) -> int:
        start.wait()
        return houses[n].append_files("t", [data_file(lh, n)], app_id="stream", batch_id=3)

    versions = run_threads(*[lambda n=n: replay(n) for n in range(6)])
    assert len(set(versions)) == 1
    assert lh.version("t") == 1
    assert len(lh.files("t")) == 1
    assert [(c.app_id, c.batch_id) for c in lh.history("t")] == [(None, None), ("stream", 3)]
    # int and str batch ids are different batches
    assert lh.append_files("t", [data_file(lh, 9)], app_id="stream", batch_id="3") == 2


@LOCAL
def test_overwrite_on_a_stale_base_conflicts(
    lakehouse_tm: TransactionManager, lh: Lakehouse
) -> None:
    catalog = Catalog(lakehouse_tm, "lakehouse")
    lh.append_files("t", [data_file(lh, 1)])
    entry = FileEntry(f"{STAGING_PREFIX}j/day=d1/new.parquet", 1, 1, {"day": "d1"})
    with pytest.raises(ConcurrentModificationError, match="based on version 0"):
        catalog.commit_files(
            "t",
            OVERWRITE,
            [entry],
            job_id="j",
            job_started_ms=time.time_ns() // 10**6,
            base_version=0,
        )
    assert lh.version("t") == 1
    done = catalog.commit_files(
        "t", OVERWRITE, [entry], job_id="j", job_started_ms=time.time_ns() // 10**6, base_version=1
    )
    assert (done.version, done.replayed) == (2, False)
    assert [f.path for f in lh.files("t")] == [f"{lh.warehouse}/t/{entry.path}"]


@LOCAL
@pytest.mark.parametrize("checkpoint_every", [None, 4])
def test_time_travel_matches_a_model(
    lakehouse_tm: TransactionManager,
    lh: Lakehouse,
    monkeypatch: pytest.MonkeyPatch,
    checkpoint_every: int | None,
) -> None:
    """Random appends and overwrites; every version lists exactly the model's files."""
    if checkpoint_every is not None:
        monkeypatch.setattr(checkpoints_module, "CHECKPOINT_INTERVAL", checkpoint_every)
        monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 3)
    catalog = Catalog(lakehouse_tm, "lakehouse")
    rng = random.Random(7)
    model: list[list[str]] = [[]]
    n = 0
    for version in range(1, 41):
        batch = []
        for _ in range(rng.randrange(0, 4)):
            n += 1
            batch.append(FileEntry(f"{STAGING_PREFIX}j/day=d/f{n}.parquet", n, n, {"day": "d"}))
        if rng.random() < 0.2:
            done = catalog.commit_files(
                "t",
                OVERWRITE,
                batch,
                job_id=f"j{version}",
                job_started_ms=time.time_ns() // 10**6,
                base_version=version - 1,
            )
            model.append([e.path for e in batch])
        else:
            done = catalog.commit_files(
                "t", APPEND, batch, job_id=f"j{version}", job_started_ms=time.time_ns() // 10**6
            )
            model.append(model[-1] + [e.path for e in batch])
        assert done.version == version
    prefix = f"{lh.warehouse}/t/"
    for version, expected in enumerate(model):
        assert [f.path.removeprefix(prefix) for f in lh.files("t", version)] == expected
    history = lh.history("t")
    for version in range(1, len(model)):
        commit = history[version]
        before, after = set(model[version - 1]), set(model[version])
        if commit.operation == "OVERWRITE":
            assert {p.removeprefix(prefix) for p in commit.removed_files} == before
        else:
            assert commit.removed_files == ()
        assert {p.removeprefix(prefix) for p in commit.added_files} == after - (
            before if commit.operation == "WRITE" else set()
        )
    with pytest.raises(VersionNotFoundError):
        lh.files("t", len(model))
    with lakehouse_tm.begin() as tx:
        checkpoints = list(tx.scan("lakehouse.checkpoints"))
    assert bool(checkpoints) == (checkpoint_every is not None)


def count_scanned_rows(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, the table of every row an embedded transaction's scan yields."""
    scans: list[str] = []
    real_scan = EmbeddedTransaction.scan

    def counting_scan(self: EmbeddedTransaction, table: str, *args: Any, **kwargs: Any) -> Any:
        for item in real_scan(self, table, *args, **kwargs):
            scans.append(table)
            yield item

    monkeypatch.setattr(EmbeddedTransaction, "scan", counting_scan)
    return scans


@LOCAL
def test_checkpoints_bound_the_rows_listing_reads(
    lakehouse_tm: TransactionManager, lh: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 4)
    for k in range(25):
        lh.append_files("t", [data_file(lh, k), data_file(lh, 1000 + k)])
    scans = count_scanned_rows(monkeypatch)
    files = lh.files("t")
    assert [f.record_count for f in files] == [n for k in range(25) for n in (k, 1000 + k)]
    # The checkpoint at version 20 (read where it is due, no markers scanned), then
    # versions 21-25 row by row.
    assert scans.count("lakehouse.checkpoints") == 0
    assert scans.count("lakehouse.files") == 10
    assert [f.record_count for f in lh.files("t", 12)] == [
        n for k in range(12) for n in (k, 1000 + k)
    ]


@LOCAL
def test_listing_reads_one_generation(lakehouse_tm: TransactionManager, lh: Lakehouse) -> None:
    """Overwrites leave earlier generations out of the latest listing's range."""
    catalog = Catalog(lakehouse_tm, "lakehouse")
    for k in range(30):
        lh.append_files("t", [data_file(lh, k)])
    entry = FileEntry(f"{STAGING_PREFIX}j/day=d1/only.parquet", 1, 1, {"day": "d1"})
    catalog.commit_files(
        "t", OVERWRITE, [entry], job_id="j", job_started_ms=time.time_ns() // 10**6, base_version=30
    )
    scanned: list[bytes] = []
    with lakehouse_tm.begin() as tx:
        start, end = Layout.file_range("t", 1, below_version=32)
        scanned = [row for row, _, _ in tx.scan("lakehouse.files", start, end)]
    assert len(scanned) == 1
    assert len(lh.files("t")) == 1
    assert len(lh.files("t", 30)) == 30


@LOCAL
def test_unknown_commit_outcome_is_settled_not_retried_blindly(
    lakehouse_tm: TransactionManager, lh: Lakehouse, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="txn._retry")
    points = lakehouse_tm.failpoints
    attempts = lakehouse_tm.config.settle_attempts

    def timeout(start_ts: int) -> None:
        raise StoreTimeoutError("reply lost")

    # The commit point applied but its reply was lost, and settling kept timing out.
    points.enable(txn_fp.AFTER_COMMIT_POINT, timeout, times=1)
    points.enable(txn_fp.SETTLE_COMMIT, timeout, times=attempts)
    assert lh.append_files("t", [data_file(lh, 1)]) == 1
    assert "settled as committed" in caplog.text
    # The commit point never ran: settled as not committed, then retried once.
    points.enable(txn_fp.BEFORE_COMMIT_POINT, timeout, times=1)
    points.enable(txn_fp.SETTLE_COMMIT, timeout, times=attempts)
    assert lh.append_files("t", [data_file(lh, 2)]) == 2
    assert "settled as not committed" in caplog.text
    assert len(lh.files("t")) == 2
    assert [c.version for c in lh.history("t")] == [0, 1, 2]


@LOCAL
def test_unsettleable_outcome_raises_commit_unknown(
    lakehouse_tm: TransactionManager, lh: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    def timeout(start_ts: int) -> None:
        raise StoreTimeoutError("reply lost")

    lakehouse_tm.failpoints.enable(txn_fp.BEFORE_COMMIT_POINT, timeout, times=1)
    lakehouse_tm.failpoints.enable(txn_fp.SETTLE_COMMIT, timeout)

    def store_down(*args: object, **kwargs: object) -> bool:
        raise TransactionError("read failed: store unreachable")

    monkeypatch.setattr(lakehouse_tm, "outcome", store_down)
    with pytest.raises(CommitUnknownError) as info:
        lh.append_files("t", [data_file(lh, 1)])
    assert isinstance(info.value.__cause__, TransactionError)


@LOCAL
def test_vacuum_fence_keeps_files_committed_after_its_plan(
    lakehouse_tm: TransactionManager, lh: Lakehouse
) -> None:
    catalog = Catalog(lakehouse_tm, "lakehouse")
    cutoff = time.time_ns() // 10**6
    plan = catalog.vacuum_plan("t", cutoff)
    # Committed between the plan and the fence, by a job that started before the cutoff.
    lh.append_files("t", [data_file(lh, 5)], written_since_ms=cutoff - 1000)
    since = catalog.vacuum_fence("t", plan, cutoff)
    assert since == {f"{STAGING_PREFIX}job/day=d1/part-000005.parquet"}
    # After the fence, such a job can no longer commit.
    with pytest.raises(ConcurrentModificationError, match="vacuum"):
        lh.append_files("t", [data_file(lh, 6)], written_since_ms=cutoff - 1000)
    assert lh.append_files("t", [data_file(lh, 7)], written_since_ms=cutoff) == 2


def _touch(path: Path, age_s: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    then = time.time() - age_s
    os.utime(path, (then, then))


def test_sweep_removes_only_unreferenced_files_of_old_jobs(tmp_path: Path) -> None:
    location = tmp_path / "t"
    old = new_job(str(location))
    young = new_job(str(location))
    old_started = old.started_ms - 3_600_000
    old_folder = location / (
        STAGING_PREFIX
        + time.strftime("%Y%m%dT%H%M%S", time.gmtime(old_started // 1000))
        + f".{old_started % 1000:03d}Z-00aa"
    )
    assert job_started_ms(old_folder.name) == old_started
    live = old_folder / "day=1" / "part-0.parquet"
    dead = old_folder / "day=2" / "part-1.parquet"
    for path in (
        live,
        live.with_name(".part-0.parquet.crc"),
        dead,
        dead.with_name(".part-1.parquet.crc"),
        old_folder / "_SUCCESS",
    ):
        _touch(path, 3600)
    orphan_folder = location / (old_folder.name.replace("00aa", "00bb"))
    _touch(orphan_folder / "_temporary" / "0" / "part-9.parquet", 3600)
    running = Path(young.staging) / "day=1" / "part-0.parquet"
    _touch(running, 0)
    foreign = location / "notes.txt"
    _touch(foreign, 3600)
    keep = {os.path.relpath(live, location)}
    removed = set(sweep(str(location), keep, cutoff_ms=young.started_ms - 1000))
    assert removed == {
        str(dead),
        str(dead.with_name(".part-1.parquet.crc")),
        str(dead.parent),
        str(orphan_folder / "_temporary" / "0" / "part-9.parquet"),
        str(orphan_folder / "_temporary" / "0"),
        str(orphan_folder / "_temporary"),
        str(orphan_folder),
    }
    assert live.exists() and live.with_name(".part-0.parquet.crc").exists()
    assert (old_folder / "_SUCCESS").exists()
    assert running.exists() and foreign.exists()


def test_partition_folders_are_unescaped() -> None:
    assert parse_partition("a=x%2Fy%3Dz/b=__HIVE_DEFAULT_PARTITION__", ("a", "b")) == {
        "a": "x/y=z",
        "b": None,
    }
    with pytest.raises(ValueError):
        parse_partition("b=1/a=2", ("a", "b"))


def test_commit_records_are_plain_values() -> None:
    commit = Commit(1, 5, "WRITE", ("p",), (), None, None)
    assert commit.timestamp_ms == 0
    assert DataFile("/x", 1, 2).partition == {}


@LOCAL
def test_append_files_validates_paths(lh: Lakehouse) -> None:
    with pytest.raises(ValueError, match="job folder"):
        lh.append_files("t", [DataFile(f"{lh.warehouse}/t/loose.parquet", 1, 1, {"day": "d"})])
    with pytest.raises(ValueError, match="partition values"):
        lh.append_files(
            "t", [DataFile(f"{lh.warehouse}/t/{STAGING_PREFIX}j/day=d/x.parquet", 1, 1, {})]
        )
    with pytest.raises(TableNotFoundError):
        lh.append_files("missing", [])
    assert lh.version("t") == 0


def test_young_tables_checkpoint_every_hundred_versions_then_every_thousand() -> None:
    due = [n for n in range(1, 30_001) if checkpoints_module.checkpoint_due(n)]
    assert due[:3] == [100, 200, 300]
    assert [n for n in due if 9_800 <= n <= 12_000] == [9_800, 9_900, 10_000, 11_000, 12_000]
    assert not checkpoints_module.checkpoint_due(0) and not checkpoints_module.checkpoint_due(150)


@LOCAL
def test_a_table_of_a_few_hundred_commits_lists_from_a_checkpoint(
    lakehouse_tm: TransactionManager, lh: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in range(130):
        lh.append_files("t", [data_file(lh, k)])
    scans = count_scanned_rows(monkeypatch)
    assert [f.record_count for f in lh.files("t")] == list(range(130))
    # The checkpoint at version 100, read where it is due, then versions 101-130 row by row.
    assert scans.count("lakehouse.checkpoints") == 0
    assert scans.count("lakehouse.files") == 30


def test_checkpoints_due_at_or_below_a_version() -> None:
    due = checkpoints_module.due_at_or_below
    assert due(250) == [200, 100] and due(200) == [200, 100] and due(150) == [100]
    assert due(99) == [] and due(0) == [] and due(10_500) == [10_000, 9_900]
    # The arithmetic agrees with checkpoint_due, also under other intervals.
    for interval, early in ((1000, 100), (10, 100), (4, 100), (7, 3), (7, 100)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(checkpoints_module, "CHECKPOINT_INTERVAL", interval)
            patch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", early)
            every = [n for n in range(1, 12_500) if checkpoints_module.checkpoint_due(n)]
            for n in range(12_500):
                below = every[: bisect.bisect_right(every, n)]
                assert due(n, 3) == below[::-1][:3], (interval, early, n)


@LOCAL
@pytest.mark.parametrize("lost", ["the newest due", "both due"])
def test_listing_without_the_checkpoint_where_one_is_due(
    lakehouse_tm: TransactionManager,
    lh: Lakehouse,
    monkeypatch: pytest.MonkeyPatch,
    lost: str,
) -> None:
    """A checkpoint whose follow-up never ran (skipped, failed, or written under other
    intervals) is not where one is due: listing takes the previous one, or scans for
    one, and lists the same files."""
    monkeypatch.setattr(checkpoints_module, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 4)
    for k in range(25):
        lh.append_files("t", [data_file(lh, k)])
    expected = list(range(25))
    gone = [20] if lost == "the newest due" else [20, 10]
    with lakehouse_tm.begin() as tx:
        for version in gone:
            tx.delete(
                "lakehouse.checkpoints",
                Layout.checkpoint_row("t", 0, version),
                Layout.COL_CHECKPOINT,
            )
    # A checkpoint where none is due (as an interval of 7 once wrote): found by a scan.
    checkpoints_module.write_checkpoint(lakehouse_tm, Layout("lakehouse"), "t", 0, 0, 14)
    scans = count_scanned_rows(monkeypatch)
    assert [f.record_count for f in lh.files("t")] == expected
    if lost == "the newest due":  # the one at version 10, then versions 11-25
        assert scans.count("lakehouse.checkpoints") == 0
        assert scans.count("lakehouse.files") == 15
    else:  # scanned: the newest is the one at version 14, then versions 15-25
        assert scans.count("lakehouse.checkpoints") == 1
        assert scans.count("lakehouse.files") == 11
    assert [f.record_count for f in lh.files("t", 12)] == list(range(12))


def _job_folder(location: str, started_ms: int, suffix: str = "00aa") -> str:
    """A job folder whose name carries ``started_ms``, as ``new_job`` names them."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started_ms // 1000))
    name = f"{STAGING_PREFIX}{stamp}.{started_ms % 1000:03d}Z-{suffix}"
    assert job_started_ms(name) == started_ms
    return join(location, name)


def _put(path: str, age_s: float) -> None:
    """A file at ``path`` on its store, ``age_s`` old where the store lets a test say
    so (a local file's mtime; an object's time is the server's, always now)."""
    filesystem.write_bytes(path, b"x")
    if not is_object_store(path):
        then = time.time() - age_s
        os.utime(path, (then, then))


@pytest.mark.parametrize(
    ("folders", "warehouse"),
    [
        *[
            (folders, store)
            for folders in ("one old job", "old and young jobs")
            for store in BOTH_STORES
        ],
        # Dated by mtimes, which only a local file lets a test set in the past.
        ("foreign name", "local"),
    ],
    indirect=["warehouse"],
)
def test_append_files_is_fenced_by_a_vacuum_after_its_jobs_start(
    lh: Lakehouse, folders: str
) -> None:
    """Fails before the fix: ``append_files`` took "now" as the job's start, so it
    committed files that a vacuum had removed (or was about to).

    Interleaving: a job folder is named for its start S (10 s ago) and a file is
    written in it; a vacuum with cutoff C, S < C < now, fences C in the head and
    removes the unreferenced file (vacuum goes by the folder's start time); then
    ``append_files`` without ``written_since_ms`` commits. Its job started before C,
    so it must fail and commit nothing. A folder whose name carries no start time
    is dated by its files' mtimes, as vacuum dates it; a file already removed can no
    longer be dated, so there the commit comes between the vacuum's fence and its
    sweep (which would then remove the file the commit named).
    """
    location = join(lh.warehouse, "t")
    now = time.time_ns() // 10**6
    if folders == "foreign name":
        old_folder = join(location, f"{STAGING_PREFIX}written-by-another-tool")
    else:
        old_folder = _job_folder(location, now - 10_000)
    old = join(old_folder, "day=d1", "part-0.parquet")
    _put(old, 10)
    paths = [old]
    if folders == "old and young jobs":
        young = join(_job_folder(location, now + 60_000, "00bb"), "day=d1", "part-0.parquet")
        _put(young, 0)
        paths.append(young)
    files = [DataFile(p, 1, 1, {"day": "d1"}) for p in paths]
    if folders == "foreign name":
        catalog, cutoff = lh._catalog, now - 5000
        catalog.vacuum_fence("t", catalog.vacuum_plan("t", cutoff), cutoff)
    else:
        assert old in lh.vacuum("t", retain_seconds=5)
        assert not filesystem.exists(old)
    with pytest.raises(ConcurrentModificationError, match="vacuum"):
        lh.append_files("t", files)
    assert lh.version("t") == 0
    assert lh.files("t") == []


@pytest.mark.parametrize("warehouse", BOTH_STORES, indirect=True)
def test_append_files_of_a_job_younger_than_the_cutoff_commits(lh: Lakehouse) -> None:
    location = join(lh.warehouse, "t")
    lh.vacuum("t", retain_seconds=5)
    job = join(_job_folder(location, time.time_ns() // 10**6 - 1000), "day=d1", "part-0.parquet")
    _put(job, 1)
    assert lh.append_files("t", [DataFile(job, 1, 1, {"day": "d1"})]) == 1
    assert filesystem.exists(job)
    # Files that are not on disk (metadata only) in a foreign folder: started now.
    assert lh.append_files("t", [data_file(lh, 1)]) == 2
