"""Lakehouse retention (issue 17, item 4): expiring log records, file rows and marks.

Commit times come from a fake clock (the catalog's ``now_ms``), so which versions
and marks a retention keeps is exact. Every test holds expiry to what it promises:
the latest and every retained version list exactly the files they listed when they
committed, and their history is unchanged; an expired version raises
``VersionNotFoundError`` saying so; a replay of an expired batch id commits again,
a replay of a retained one does not; and the rows expiry deleted are gone, from the
store too once garbage collection has run.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import LongType, StringType, StructField, StructType

import spark_integration.engine.catalog as catalog_module
import spark_integration.engine.checkpoints as checkpoints_module
import spark_integration.engine.expiry as expiry_module
import spark_integration.engine.retention as retention_module
import spark_integration.spark.lakehouse as lakehouse_module
from spark_integration import (
    DataFile,
    ExpireResult,
    Lakehouse,
    Retention,
    TableNotFoundError,
    VersionNotFoundError,
)
from spark_integration.engine import Catalog, HistoryEntry
from spark_integration.engine.model import APPEND, OVERWRITE, FileEntry, Layout, TableMeta
from spark_integration.engine.retention import (
    DAY_S,
    JOB_MARK_MIN_RETENTION_S,
    ExpiryState,
    _first,
    read_expiry,
)
from spark_integration.spark.hook import STAGING_PREFIX
from storage_adapters import Cell
from txn import GarbageCollector, Transaction, TransactionConfig, TransactionManager
from txn.tables import GC_TABLE, STATE_KEY, GcState

pytestmark = pytest.mark.unit

T0_MS = 1_700_000_000_000
DAY_MS = int(DAY_S * 1000)
SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
META = TableMeta("t", "{}", ("day",), "/nowhere/t", T0_MS)


class Clock:
    """The catalog's wall clock, moved by the test."""

    def __init__(self) -> None:
        self.ms = T0_MS

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        self.ms += ms
        return self.ms


@pytest.fixture(params=["memory", "sqlite"])
def tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"
    manager = TransactionManager.embedded(
        url, config=TransactionConfig(resolve_wait_ms=300, gc_publish_interval_ms=10**9)
    )
    # A grace of 0 before any reader leases the state row: collection need not wait.
    manager.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
    yield manager
    manager.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(catalog_module, "now_ms", fake)
    monkeypatch.setattr(lakehouse_module, "now_ms", fake)
    return fake


@pytest.fixture
def small_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint every 4 versions of a generation, 3 files a chunk."""
    monkeypatch.setattr(checkpoints_module, "CHECKPOINT_INTERVAL", 4)
    monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 3)


def entry(n: int) -> FileEntry:
    return FileEntry(f"{STAGING_PREFIX}j{n}/day=d/f{n}.parquet", n, n, {"day": "d"})


class Table:
    """Commits to table ``t`` through a catalog, remembering what each version read."""

    def __init__(self, catalog: Catalog, clock: Clock) -> None:
        self.catalog = catalog
        self.clock = clock
        self.files: dict[int, list[str]] = {0: []}
        self.history: dict[int, HistoryEntry] = {}
        self.committed_ms: dict[int, int] = {0: clock()}
        self.n = 0

    def commit(
        self,
        files: int = 1,
        overwrite: bool = False,
        batch: int | None = None,
        via: Catalog | None = None,
    ) -> int:
        """``via``: another catalog of the store, as another process's would commit."""
        entries = []
        for _ in range(files):
            self.n += 1
            entries.append(entry(self.n))
        head = self.catalog.prepare("t").head.version
        done = (via or self.catalog).commit_files(
            "t",
            OVERWRITE if overwrite else APPEND,
            entries,
            job_id=f"job-{self.n}-{len(self.files)}",
            job_started_ms=self.clock(),
            app_id=None if batch is None else "app",
            batch_id=batch,
            base_version=head if overwrite else None,
        )
        if done.replayed:
            return done.version
        version = done.version
        self.files[version] = self.listing(version)
        self.history[version] = self.catalog.history("t")[-1]
        self.committed_ms[version] = self.history[version].record.timestamp_ms
        return version

    def listing(self, version: int | None) -> list[str]:
        return [e.path for e in self.catalog.files("t", version, FileEntry)[2]]

    def expected_readable_from(self, now_ms: int, log_retention_s: float) -> int:
        latest = max(self.files)
        cutoff = now_ms - int(log_retention_s * 1000)
        return min(v for v in self.files if v == latest or self.committed_ms[v + 1] >= cutoff)

    def check(self, readable_from: int) -> None:
        """Readable versions read exactly as before; older ones raise 'expired'."""
        latest = max(self.files)
        assert self.catalog.prepare("t").head.min_readable_version == readable_from
        for version in range(readable_from, latest + 1):
            assert self.listing(version) == self.files[version], version
        for version in range(readable_from):
            with pytest.raises(VersionNotFoundError, match="expired"):
                self.catalog.files("t", version, FileEntry)
        history = self.catalog.history("t")
        assert [h.record.version for h in history] == list(range(readable_from, latest + 1))
        for h in history:
            assert h == self.history[h.record.version]


def new_table(tm: TransactionManager, clock: Clock, retention: Retention | None) -> Table:
    catalog = Catalog(tm, "lakehouse")
    catalog.create(META, "create-t", retention=retention)
    table = Table(catalog, clock)
    table.history[0] = catalog.history("t")[0]
    return table


def cells(tm: TransactionManager, kind: str) -> list[tuple[bytes, bytes]]:
    with tm.begin() as tx:
        return [(row, column) for row, column, _ in tx.scan(f"lakehouse.{kind}")]


def mark_versions(tm: TransactionManager) -> dict[str, set[int]]:
    """Versions that still have a batch mark and a job mark."""
    out: dict[str, set[int]] = {"batch": set(), "job": set()}
    with tm.begin() as tx:
        for row, _, value in tx.scan("lakehouse.marks"):
            out["job" if b'"j"' in row else "batch"].add(int(value))
    return out


# --- properties ----------------------------------------------------------------------


def test_retention_defaults_and_checks() -> None:
    assert Retention() == Retention(30 * DAY_S, 7 * DAY_S)
    assert JOB_MARK_MIN_RETENTION_S == DAY_S
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite and >= 0"):
            Retention(log_retention_s=bad)
    with pytest.raises(TypeError):
        Retention(mark_retention_s=True)
    assert Retention.decode(Retention(1.5, 0).encode()) == Retention(1.5, 0)


def test_retention_is_set_at_creation_and_changed_later(
    tm: TransactionManager, tmp_path: Path
) -> None:
    lh = Lakehouse(tm, tmp_path / "warehouse")
    lh.create_table("a", SCHEMA)
    lh.create_table("b", SCHEMA, retention=Retention(3600, 60))
    assert lh.retention("a") == Retention()
    assert lh.retention("b") == Retention(3600, 60)
    lh.set_retention("a", Retention(mark_retention_s=0))
    assert lh.retention("a") == Retention(30 * DAY_S, 0)
    assert lh.version("a") == 0  # a property change writes no version
    assert lh.list_tables() == ["a", "b"]  # the retention cells are not tables
    with pytest.raises(TableNotFoundError):
        lh.set_retention("missing", Retention())
    with pytest.raises(TypeError):
        lh.set_retention("a", 3600)  # type: ignore[arg-type]


# --- what expiry keeps ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [3, 11])
def test_every_retained_version_reads_as_before_pass_after_pass(
    tm: TransactionManager, clock: Clock, small_checkpoints: None, seed: int
) -> None:
    """Random appends and overwrites at random times; expiry runs after checkpoints
    and in passes cut short at random row budgets. After each one, every retained
    version lists exactly its files and history is unchanged; older ones expired."""
    rng = random.Random(seed)
    log_s = 10.0
    table = new_table(tm, clock, Retention(log_retention_s=log_s, mark_retention_s=4))
    for batch in range(1, 61):
        clock.advance(rng.choice([0, 300, 1000, 2500]))
        table.commit(files=rng.randrange(0, 4), overwrite=rng.random() < 0.2, batch=batch)
        if rng.random() < 0.2:
            budget = rng.choice([None, 1, 5, 40])
            while True:
                done = table.catalog.expire("t", clock(), max_rows=budget)
                if budget is None or done.deleted < budget:
                    break
                # A pass cut short leaves everything readable that was readable.
                table.check(done.readable_from)
            table.check(table.expected_readable_from(clock(), log_s))
    clock.advance(3000)
    done = table.catalog.expire("t", clock())
    readable = table.expected_readable_from(clock(), log_s)
    assert done.readable_from == readable
    table.check(readable)
    # Batch marks went with their versions' age; job marks are kept a day.
    marks = mark_versions(tm)
    young = {v for v, ms in table.committed_ms.items() if v and ms >= clock() - 4000}
    assert marks["batch"] == young
    assert marks["job"] == set(table.files) - {0}
    # Log records stay while the job marks they index do.
    assert len(cells(tm, "log")) == 2 * len(table.files)
    # A day later every version but the latest has expired, every mark has gone, and
    # so has every log record but the latest's.
    clock.advance(2 * DAY_MS)
    done = table.catalog.expire("t", clock())
    latest = max(table.files)
    assert done.readable_from == latest
    table.check(latest)
    assert mark_versions(tm) == {"batch": set(), "job": set()}
    assert {Layout.version_of_log_row("t", row) for row, _ in cells(tm, "log")} == {latest}
    # Of the rows listing reads only the latest generation's are left, and of those
    # only the rows from its oldest checkpoint on.
    head = table.catalog.prepare("t").head
    checkpoints = {Layout.parse_file_row("t", row)[:2] for row, _ in cells(tm, "checkpoints")}
    rows = {Layout.parse_file_row("t", row)[:2] for row, _ in cells(tm, "files")}
    assert {g for g, _ in checkpoints | rows} <= {head.gen}
    if checkpoints:
        kept = min(v for _, v in checkpoints)
        assert all(v >= min(kept + 1, latest) for _, v in rows)


def test_only_rows_a_checkpoint_holds_go(
    tm: TransactionManager, clock: Clock, small_checkpoints: None
) -> None:
    """Versions 1-10 in generation 0 (checkpoints at 4 and 8); the oldest readable
    version 6 needs checkpoint 4 and the rows of 5 and up; generation 0's rows below
    5, the log below 6, and nothing else, go."""
    table = new_table(tm, clock, Retention(log_retention_s=60, mark_retention_s=60))
    for _ in range(10):
        clock.advance(10_000)
        table.commit()
    now = table.committed_ms[7] + 60_000  # version 7 is the first inside the retention
    done = table.catalog.expire("t", now)
    assert done.readable_from == 6
    assert (done.file_rows, done.checkpoints, done.generations) == (4, 0, 0)
    assert done.log_cells == 0  # kept a day, while the job marks they index are
    versions = sorted(Layout.parse_file_row("t", row)[1] for row, _ in cells(tm, "files"))
    assert versions == list(range(5, 11))
    checkpoints = sorted(Layout.parse_file_row("t", row)[1] for row, _ in cells(tm, "checkpoints"))
    assert checkpoints == [4, 8]
    table.check(6)
    with tm.begin() as tx:
        assert read_expiry(tx, table.catalog.layout, "t").partial == {0: 4}


def test_the_overwrite_that_is_the_oldest_readable_version_keeps_what_it_removed(
    tm: TransactionManager, clock: Clock, small_checkpoints: None
) -> None:
    table = new_table(tm, clock, Retention(log_retention_s=60, mark_retention_s=60))
    for _ in range(6):
        clock.advance(10_000)
        table.commit(files=2)
    clock.advance(10_000)
    overwrite = table.commit(files=1, overwrite=True)
    for _ in range(6):
        clock.advance(10_000)
        table.commit()
    done = table.catalog.expire("t", table.committed_ms[overwrite + 1] + 60_000)
    assert done.readable_from == overwrite
    table.check(overwrite)
    removed = table.catalog.history("t")[0].removed
    assert [e.path for e in removed] == table.files[overwrite - 1]
    # Once the overwrite expires too, its generation's predecessor goes entirely.
    done = table.catalog.expire("t", table.committed_ms[overwrite + 2] + 60_000)
    assert done.readable_from == overwrite + 1
    assert done.generations == 1
    table.check(overwrite + 1)
    assert all(Layout.parse_file_row("t", row)[0] == 1 for row, _ in cells(tm, "files"))


def test_time_travel_to_an_expired_version_says_it_expired(
    tm: TransactionManager, clock: Clock, tmp_path: Path
) -> None:
    lh = Lakehouse(tm, tmp_path / "warehouse")
    lh.create_table("t", SCHEMA, "day", retention=Retention(60, 60))
    for k in range(5):
        clock.advance(30_000)
        path = f"{lh.warehouse}/t/{STAGING_PREFIX}j{k}/day=d/f.parquet"
        lh.append_files("t", [DataFile(path, 1, 1, {"day": "d"})])
    kept_ms = clock()
    clock.advance(45_000)
    result = lh.expire("t")
    assert isinstance(result, ExpireResult)
    assert result.readable_from == 4
    with pytest.raises(VersionNotFoundError, match=r"version 2 of table 't' expired.*60 s"):
        lh.files("t", 2)
    with pytest.raises(VersionNotFoundError, match="expired"):
        lh.version_at("t", T0_MS + 45_000)
    assert lh.version_at("t", kept_ms) == 5
    assert lh.version_at("t", kept_ms - 1) == 4
    assert [c.version for c in lh.history("t")] == [4, 5]
    assert len(lh.files("t", 4)) == 4


# --- marks ---------------------------------------------------------------------------


def test_a_replay_of_an_expired_batch_commits_again_a_retained_one_does_not(
    tm: TransactionManager, clock: Clock, tmp_path: Path
) -> None:
    lh = Lakehouse(tm, tmp_path / "warehouse")
    lh.create_table("t", SCHEMA, "day", retention=Retention(mark_retention_s=60))

    def append(batch: int) -> int:
        path = f"{lh.warehouse}/t/{STAGING_PREFIX}b{batch}-{clock()}/day=d/f.parquet"
        return lh.append_files(
            "t", [DataFile(path, 1, 1, {"day": "d"})], app_id="app", batch_id=batch
        )

    assert append(1) == 1
    clock.advance(120_000)
    assert append(2) == 2
    assert append(1) == 1  # inside the retention: a replay
    result = lh.expire("t")
    assert (result.batch_marks, result.job_marks, result.log_cells) == (1, 0, 0)
    assert result.readable_from == 0  # 30 days of log: every version stays
    assert append(2) == 2  # retained: still a replay
    assert append(1) == 3  # expired: committed again, as a new version
    assert append(1) == 3  # ... and marked again
    assert [(c.version, c.batch_id) for c in lh.history("t")][1:] == [(1, 1), (2, 2), (3, 1)]


def test_job_marks_stay_a_day_whatever_the_mark_retention(
    tm: TransactionManager, clock: Clock
) -> None:
    table = new_table(tm, clock, Retention(log_retention_s=0, mark_retention_s=0))
    for batch in range(1, 4):
        table.commit(batch=batch)
    done = table.catalog.expire("t", clock.advance(1000))
    assert done.batch_marks == 3
    assert done.job_marks == 0
    # Their log records stay while the job marks need them (and leave history).
    assert done.readable_from == 3
    assert [h.record.version for h in table.catalog.history("t")] == [3]
    assert len(cells(tm, "log")) == 2 * 4
    done = table.catalog.expire("t", clock.advance(DAY_MS))
    assert (done.job_marks, done.log_cells) == (3, 2 * 3)
    assert cells(tm, "marks") == []


def test_expiry_follows_checkpoints_by_itself(
    tm: TransactionManager, clock: Clock, small_checkpoints: None
) -> None:
    table = new_table(tm, clock, Retention(log_retention_s=1, mark_retention_s=1))
    for batch in range(1, 9):
        clock.advance(2000)
        table.commit(batch=batch)
    # The checkpoint at version 8 was followed by an expiry as of then: version 7
    # was the latest a second before.
    assert table.catalog.prepare("t").head.min_readable_version == 7
    assert mark_versions(tm)["batch"] == {8}
    table.check(7)


# --- with commits racing, and after garbage collection --------------------------------


def test_expiry_racing_commits_and_readers(
    tm: TransactionManager, clock: Clock, small_checkpoints: None
) -> None:
    """An appender, a reader of the latest version and an expirer at once: every
    listing the reader got is the one its version had, and so is every version left."""
    table = new_table(tm, clock, Retention(log_retention_s=0, mark_retention_s=0))
    stop = threading.Event()
    seen: list[tuple[int, list[str]]] = []
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            for batch in range(1, 41):
                clock.advance(100)
                table.commit(files=2, overwrite=batch % 13 == 0, batch=batch)
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def reader() -> None:
        try:
            while not stop.is_set():
                _, version, files = table.catalog.files("t", None, FileEntry)
                seen.append((version, [e.path for e in files]))
        except BaseException as exc:
            errors.append(exc)

    def expirer() -> None:
        try:
            while not stop.is_set():
                table.catalog.expire("t", clock(), max_rows=7)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (appender, reader, expirer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert seen
    for version, files in seen:
        assert files == table.files[version], version
    done = table.catalog.expire("t", clock.advance(1))
    assert done.readable_from == 40
    table.check(40)


def test_collection_then_removes_expired_rows_from_the_store(
    tm: TransactionManager, clock: Clock, small_checkpoints: None
) -> None:
    table = new_table(tm, clock, Retention(log_retention_s=0, mark_retention_s=0))
    for batch in range(1, 10):
        table.commit(batch=batch)
    with tm.begin() as tx:
        old_marks = [Cell(row, col) for row, col, _ in tx.scan("lakehouse.marks")]
        old_log = [
            Cell(row, col)
            for row, col, _ in tx.scan("lakehouse.log")
            if Layout.version_of_log_row("t", row) < 9
        ]
    done = table.catalog.expire("t", clock.advance(2 * DAY_MS))
    assert done.readable_from == 9
    assert cells(tm, "marks") == []
    GarbageCollector(
        tm.store, timestamps=tm._rt.timestamps, locks=tm.locks, retention_s=0, grace_ms=0
    ).run_once()
    assert tm.store.get_versions("lakehouse.marks", old_marks) == {}
    assert tm.store.get_versions("lakehouse.log", old_log) == {}
    table.check(9)
    with tm.begin() as tx:
        assert read_expiry(tx, table.catalog.layout, "t") != ExpiryState()


# --- the publish under commits (issue 27) ---------------------------------------------


class LogReads:
    """A transaction that counts its reads of the table's log records."""

    def __init__(self, tx: Transaction, log_table: str, counts: list[int]) -> None:
        self._tx = tx
        self._log = log_table
        self._counts = counts

    def get(self, table: str, row: bytes, column: bytes) -> bytes | None:
        if table == self._log:
            self._counts[-1] += 1
        return self._tx.get(table, row, column)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


def test_a_publish_that_loses_the_head_to_commits_retries_without_searching_the_log(
    tm: TransactionManager, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each commit of the table between a publish's reads and its commit makes it retry
    (it raises the head's bound). A retry reads at most 3 log records, not the binary
    search again (on one Cassandra node under load the gateway's follow-up thread lost
    the head to commits for over a minute), and the bound published is the right one.
    The commits come from another catalog, as from another process: those of the
    publish's own catalog wait for it (the next test)."""
    table = new_table(tm, clock, Retention(log_retention_s=60, mark_retention_s=60))
    other = Catalog(tm, "lakehouse")
    for _ in range(150):
        clock.advance(1000)  # a version a second: 60 of them stay readable
        table.commit()
    now = clock.advance(1000)
    expected = table.expected_readable_from(now, 60)
    assert expected > table.catalog.prepare("t").head.min_readable_version

    real = retention_module.publish_expiry
    log_reads: list[int] = []  # per attempt
    raced = [0]

    def publish_losing_to_commits(tx: Transaction, layout: Layout, *args: Any) -> Any:
        log_reads.append(0)
        state = real(LogReads(tx, layout.log, log_reads), layout, *args)
        if raced[0] < 3:  # a commit of the table lands before this attempt commits
            raced[0] += 1
            table.commit(via=other)
        return state

    monkeypatch.setattr(expiry_module, "publish_expiry", publish_losing_to_commits)
    done = table.catalog.expire("t", now)

    assert raced[0] == 3
    assert len(log_reads) == 4, log_reads  # three attempts lost the head, one won
    assert log_reads[0] >= 5, log_reads  # the search: about log2(150) reads
    assert all(n <= 3 for n in log_reads[1:]), log_reads  # each retry: the memo's bounds
    assert done.readable_from == expected
    table.check(expected)


class Scans:
    """A transaction that records the tables it scans."""

    def __init__(self, tx: Transaction, scanned: list[str]) -> None:
        self._tx = tx
        self._scanned = scanned

    def scan(self, table: str, *args: Any, **kwargs: Any) -> Any:
        self._scanned.append(table)
        return self._tx.scan(table, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


def test_expiry_of_a_table_younger_than_its_retention_scans_nothing(
    tm: TransactionManager, clock: Clock, small_checkpoints: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every version readable: expiry deletes nothing and reads no generations or
    checkpoints (each scan is a request per shard on Cassandra, after every checkpoint).
    Once versions expire, the same pass scans them and deletes what a checkpoint holds."""
    table = new_table(tm, clock, Retention(log_retention_s=60, mark_retention_s=60))
    for _ in range(10):  # checkpoints at versions 4 and 8
        clock.advance(1000)
        table.commit()
    real = expiry_module.expire_step
    scanned: list[str] = []

    def step(tx: Transaction, *args: Any) -> Any:
        return real(Scans(tx, scanned), *args)

    monkeypatch.setattr(expiry_module, "expire_step", step)
    young = table.catalog.expire("t", clock())
    assert young.readable_from == 0 and young.deleted == 0
    assert scanned == []
    table.check(0)

    now = clock.advance(3_600_000)  # every version but the latest expired
    old = table.catalog.expire("t", now)
    assert old.readable_from == 10 and old.file_rows > 0
    assert "lakehouse.gens" in scanned and "lakehouse.checkpoints" in scanned
    table.check(10)


def _at_least(least: int) -> Callable[[int], bool]:
    return lambda v: v >= least


@pytest.mark.parametrize("seed", range(5))
def test_a_remembered_bound_is_taken_only_where_it_is_the_least(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        lo = rng.randrange(0, 50)
        hi = lo + rng.randrange(0, 50)
        least = rng.randint(lo, hi)
        guess = rng.choice([None, least, least - 1, least + 1, rng.randint(lo - 3, hi + 3)])
        assert _first(lo, hi, _at_least(least), guess) == least, (lo, hi, least, guess)


def test_a_publish_takes_its_turn_with_the_commits_of_its_own_process(
    tm: TransactionManager, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit of the same catalog (a gateway's group commit, from its drain thread)
    that arrives while a publish is between its reads and its commit waits for the
    publish's transaction, which then commits at its first attempt; before, each such
    commit landed first and made the publish retry (issue 27: on one Cassandra node at
    ~50 appends/s a publish lost the head for up to 40 s, and the table's file rows
    went unexpired meanwhile). The commits land after it, and the bound is the right one."""
    table = new_table(tm, clock, Retention(log_retention_s=60, mark_retention_s=60))
    for _ in range(150):
        clock.advance(1000)
        table.commit()
    now = clock.advance(1000)
    expected = table.expected_readable_from(now, 60)
    latest = max(table.files)

    real = retention_module.publish_expiry
    attempts = [0]
    committers: list[threading.Thread] = []
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            table.commit()
        except BaseException as exc:
            errors.append(exc)

    def publish_as_commits_arrive(tx: Transaction, *args: Any) -> Any:
        attempts[0] += 1
        state = real(tx, *args)
        if attempts[0] <= 3:
            committer = threading.Thread(target=commit)
            committers.append(committer)
            committer.start()
            # Long enough for the commit to land when nothing holds it back (a few
            # milliseconds on these stores); it lands meanwhile unless it waits its turn.
            committer.join(timeout=1.0)
        return state

    monkeypatch.setattr(expiry_module, "publish_expiry", publish_as_commits_arrive)
    done = table.catalog.expire("t", now)
    for committer in committers:
        committer.join(timeout=60)
    assert errors == []
    assert attempts[0] == 1, attempts  # no commit of this process landed inside it
    assert len(committers) == 1
    assert max(table.files) == latest + 1  # the commit that waited landed after it
    assert done.readable_from == expected
    table.check(expected)
