"""Garbage collection (issue 17): store size with and without it, and the latency of a
cell with a long history before and after a sweep.

Topology, every phase: client *processes* (``multiprocessing`` 'spawn', the writer
pool of :mod:`bench.bench_lakehouse_deployed`, spawn and import time excluded), each
with its own ``TransactionManager.remote``, commit through one ``percolake serve``
process (oracle, lock server, gateway) on a fresh store; the benchmark process reads
the store's size between batches, with its own connection to the store.

* **Store size** (``gc.store_rows.*``, ``gc.store_bytes.*``): 4 writer processes make
  small commits until 10,000, 30,000, 100,000, 300,000 and 1,000,000 have succeeded
  (quick mode: 1,000 and 2,000), the store's rows (versions, transactions-table
  entries, other system rows; on Cassandra also the ``cells`` index rows of cells with
  no version left, not those of live cells, which SQLite keeps inside its versions'
  primary key: see :func:`cassandra_size`) counted at each. The lakehouse
  with/without ratio is taken at :data:`LAKEHOUSE_RATIO_AT` appends on every store.

  - *hot cells*: 4 cells of one table, writer ``i`` rewrites cell ``i`` with a 16-byte
    value, one cell per transaction (no conflicts between writers);
  - *lakehouse*: one table, ``Lakehouse.append_files`` of one fresh hard link of a
    10-row Parquet file per commit (metadata-only appends, as
    :mod:`bench.bench_lakehouse_deployed` makes them).

  Without GC the gateway is plain ``percolake serve``; with GC it runs
  ``--gc-interval-s 2 --gc-retention-s 0`` (a pass 2 s after the last one ended, each
  waiting the default 5 s grace after raising the safe point), while the writers
  commit; the lakehouse table then keeps its log and batch marks
  ``--lakehouse-retention-s`` (10 s by default) instead of 30 and 7 days, so its own
  expiry (run with its checkpoints) runs during the curve too. Quick mode cannot wait
  for those passes: there, with GC means one pass
  between batches (``GarbageCollector.run_once`` in the benchmark process, retention 0,
  grace 200 ms, timestamps from the gateway's oracle, the writers idle).
  SQLite at every size; Cassandra (one 5.0 node) up to 100,000 commits: at the ~100 to
  150 commits/s the gateway reaches on it here, 1,000,000 would take two to three
  hours per curve.
* **Long history** (``gc.long_history.*``): one writer process rewrites one cell
  100,000 times (quick mode: 1,000) through the gateway (no background GC); then the
  benchmark process, a client of that gateway, times ``tx.get`` of the cell and
  ``tx.commit()`` of a transaction that rewrote it, alternately; then one pass (as
  above, from the benchmark process, while the gateway serves); then the same again.
  On Cassandra the cell is a hot cell of the 100,000-commit curve without GC (25,000
  versions), measured at its end.

``python -m bench --only bench.bench_gc`` runs the suite and merges its figures into
``bench/results/latest.json``; ``python -m bench.bench_gc --help`` runs parts of it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._results import Figure, Growth, Latency, Result
from bench.bench_lakehouse_deployed import (
    CASSANDRA1,
    PERCOLAKE,
    SQLITE,
    STORE_LABEL,
    Spec,
    WriterPool,
    _write_source,
    gateway,
    store_url,
)

log = logging.getLogger(__name__)

CELLS, LAKEHOUSE = "cells", "lakehouse"
WORKLOAD_LABEL = {
    CELLS: "small commits to 4 hot cells",
    LAKEHOUSE: "metadata-only appends to one lakehouse table",
}
#: How the store is collected during a curve.
NO_GC, GATEWAY_GC, PASSES = "without_gc", "gateway_gc", "passes"
GC_LABEL = {
    NO_GC: "no garbage collection",
    GATEWAY_GC: "percolake serve --gc-interval-s 2 --gc-retention-s 0",
    PASSES: "one GarbageCollector pass between batches (retention 0, grace 200 ms)",
}
GATEWAY_GC_ARGS = ("--gc-interval-s", "2", "--gc-retention-s", "0")
#: With GC, the lakehouse table keeps its log and batch marks this long (seconds;
#: ``--lakehouse-retention-s``): collection removes old versions of its cells, and
#: the table's own expiry (run with its checkpoints) the log records, file rows and
#: marks outside its retention. Without GC the table has the defaults (30 and 7 days).
LAKEHOUSE_GC_RETENTION_S = 10.0
PASS_GRACE_MS = 200

WRITERS = 4
HOT_TABLE = "hot"
HOT_COLUMN = b"v"
VALUE_BYTES = 16
LAKEHOUSE_TABLE = "events"
HISTORY_TABLE = "history"

CHECKPOINTS = (10_000, 30_000, 100_000, 300_000, 1_000_000)
QUICK_CHECKPOINTS = (1_000, 2_000)
#: Sizes that get figures of their own (the rest are points of the curves).
REPORTED = (10_000, 100_000, 1_000_000)
CASSANDRA_MAX_COMMITS = 100_000
#: Lakehouse appends stop here on every store: a checkpoint rewrites the table's whole
#: live file set every 1,000 versions (``spark_integration/engine/checkpoints.py``), so
#: 1,000,000 appends would write some 5 * 10**8 file entries in checkpoints alone.
LAKEHOUSE_MAX_COMMITS = 100_000
HISTORY_VERSIONS, QUICK_HISTORY_VERSIONS = 100_000, 1_000
LATENCY_SAMPLES, QUICK_LATENCY_SAMPLES = 500, 40
LATENCY_WARMUP = 20
#: The lakehouse with/without ratio is taken at this many appends on every store that
#: reaches it. The ratio falls as appends grow (without GC every append leaves about
#: four rows, with it about two: its log record and job mark, kept a day), so ratios
#: at different sizes do not compare; Cassandra's curve reaches 10,000 within its
#: budget (issue 27 compared its 0.86 at 10,000 with SQLite's 0.52 at 100,000).
LAKEHOUSE_RATIO_AT = 10_000
#: Rows a page of the version count reads (see :func:`cassandra_size`).
VERSION_PAGE_ROWS = 200

#: A curve stops at the last checkpoint it can reach within this (wall time of its
#: commits); the figures say which it reached. Loaded machine: rates vary twofold.
CURVE_BUDGET_S = {SQLITE: 3 * 3600.0, CASSANDRA1: 45 * 60.0}
#: The slowest rate a batch is given time for before it is cut off.
MIN_RATE = 20.0


# --- what a writer process does (built by the pool from ``Spec.writer``) ----------------


class HotCellWriter:
    """One small transaction per call through ``TransactionManager.remote``: rewrites
    hot cell ``spec.index`` of ``spec.table`` (row ``hot<index>``, 16-byte value)."""

    def __init__(self, spec: Spec) -> None:
        from txn import TransactionManager

        self.tm = TransactionManager.remote(spec.gateway)
        self.table = spec.table
        self.row = hot_row(spec.index)
        with self.tm.begin() as tx:  # connected: the handle is open
            tx.get(self.table, self.row, HOT_COLUMN)

    def append(self, n: int) -> None:
        with self.tm.begin() as tx:
            tx.put(self.table, self.row, HOT_COLUMN, n.to_bytes(VALUE_BYTES, "big"))

    def extras(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self.tm.close()


CELL_WRITER = f"{__name__}:{HotCellWriter.__name__}"


def hot_row(index: int) -> bytes:
    return f"hot{index}".encode()


# --- the store's size -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreSize:
    versions: int
    entries: int  # transactions-table entries
    system: int  # other system rows (garbage-collection state, oracle bound, ...)
    #: Cassandra: ``cells`` index rows of cells with no version left (garbage the index
    #: prune removes). Counted in :attr:`rows`; see :func:`cassandra_size` for why the
    #: index rows of live cells are not.
    index: int = 0
    live_index: int = 0  # Cassandra: index rows of cells that hold a version (not in rows)
    bytes_used: int | None = None  # SQLite: pages in use (the file less its free list)
    file_bytes: int | None = None  # SQLite: the database file and its WAL on disk
    #: Versions by table, largest first (the lakehouse: which of its tables grow).
    by_table: tuple[tuple[str, int], ...] = ()

    @property
    def rows(self) -> int:
        return self.versions + self.entries + self.system + self.index

    def describe(self) -> str:
        parts = f"{self.versions:,} versions, {self.entries:,} entries, {self.system:,} other"
        if len(self.by_table) > 1:
            tables = ", ".join(f"{t.rsplit('.', 1)[-1]} {n:,}" for t, n in self.by_table)
            parts += f" (versions by table: {tables})"
        if self.index or self.live_index:
            parts += (
                f", {self.index:,} index rows of cells with no version left "
                f"(and {self.live_index:,} of live cells, not counted)"
            )
        if self.bytes_used is not None:
            parts += f"; {self.bytes_used / 1e6:,.1f} MB in use"
        return parts


def sqlite_size(path: Path) -> StoreSize:
    """Counts by full reads through a read-only connection of its own (WAL: it sees
    every committed write)."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        by_table = _largest_first(
            db.execute("SELECT tbl, count(*) FROM versions GROUP BY tbl").fetchall()
        )
        versions = sum(n for _, n in by_table)
        system = dict(
            db.execute("SELECT tbl = '_txn', count(*) FROM system_rows GROUP BY 1").fetchall()
        )
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])
        free = int(db.execute("PRAGMA freelist_count").fetchone()[0])
        page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
    on_disk = sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))
    return StoreSize(
        versions=versions,
        entries=int(system.get(1, 0)),
        system=int(system.get(0, 0)),
        bytes_used=(pages - free) * page_size,
        file_bytes=on_disk,
        by_table=by_table,
    )


def _largest_first(counts: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((str(t), int(n)) for t, n in counts), key=lambda c: (-c[1], c[0])))


def cassandra_size(store: Any) -> StoreSize:
    """Counts by full reads of the keyspace's tables (paged, at the store's data
    consistency level); Cassandra does not tell bytes without a flush (nodetool).

    The ``cells`` index is counted as SQLite's count is comparable with: an index row
    whose cell holds no version is garbage (a scan reads it for nothing, and the index
    prune of garbage collection removes it), so it counts; the index row of a cell that
    holds a version does not, as SQLite's counterpart does not: SQLite finds a cell
    through its versions' primary key, a B-tree entry inside the ``versions`` row
    already counted, where Cassandra keeps that key once more in ``cells``. Counting
    those rows too added about one row per live cell to both sides of a with/without
    ratio on Cassandra only, which kept its lakehouse ratio above SQLite's whatever
    collection removed (issue 27: 30,016 of the 60,613 rows with GC at 10,000
    appends were index rows of live cells). They are reported beside the count.
    """
    from cassandra.query import SimpleStatement

    from storage_adapters.cassandra import cell_key

    keyspace = '"' + store.settings.keyspace + '"'

    def rows_of(columns: str, table: str, page: int = 5000) -> Any:
        statement = SimpleStatement(f"SELECT {columns} FROM {keyspace}.{table}", fetch_size=page)
        return store._session.execute(statement, timeout=120)

    system = [row[0] for row in rows_of("tbl", "system_rows")]
    entries = sum(1 for t in system if t == "_txn")
    # Small pages: a page reads every tombstone (swept version) of the partitions it
    # spans, and a read past 100,000 of them fails.
    versions: Counter[str] = Counter()
    alive: set[tuple[str, bytes]] = set()
    for tbl, cell in rows_of("tbl, cell", "cell_versions", VERSION_PAGE_ROWS):
        versions[tbl] += 1
        alive.add((tbl, bytes(cell)))
    dead = live = 0
    for tbl, row, column in rows_of("tbl, row, col", "cells"):
        if (tbl, cell_key(bytes(row), bytes(column))) in alive:
            live += 1
        else:
            dead += 1
    return StoreSize(
        versions=sum(versions.values()),
        entries=entries,
        system=len(system) - entries,
        index=dead,
        live_index=live,
        by_table=_largest_first(list(versions.items())),
    )


class SizeReader:
    """The size of one store, read from the benchmark process."""

    def __init__(self, store: str, url: str) -> None:
        self.kind = store
        self.url = url
        self._store: Any = None
        if store != SQLITE:
            from storage_adapters import open_store

            self._store = open_store(url)

    def read(self) -> StoreSize:
        if self._store is None:
            return sqlite_size(Path(self.url.removeprefix("sqlite:///")))
        return cassandra_size(self._store)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


# --- garbage-collection passes from the benchmark process -----------------------------


def prepare_passes(url: str) -> None:
    """Writes the ``_gc`` state row with a grace of :data:`PASS_GRACE_MS` before any
    manager ran: no timestamp is known yet, so this pass collects nothing and waits
    nothing, and later passes wait that grace, not the 5 s default a first pass waits."""
    from storage_adapters import open_store
    from txn import GarbageCollector

    store = open_store(url)
    try:
        report = GarbageCollector(store, retention_s=0, grace_ms=PASS_GRACE_MS).run_once()
        if report.safe_point:
            log.warning("the store had a safe point already: %s", report.summary())
    finally:
        store.close()


def gc_pass(url: str, address: str) -> Any:
    """One pass with retention 0, the safe point from the gateway's own oracle (as
    ``percolake serve --gc-interval-s`` takes it), its locks consulted for writers
    with no entry yet. Returns the :class:`txn.GcReport`."""
    from lockserver.lock_service import RemoteLockService
    from storage_adapters import open_store
    from tso.timestamp_service import RemoteTimestampSource
    from txn import GarbageCollector
    from wire.channels import Connection

    conn = Connection(address)
    store = open_store(url)
    try:
        collector = GarbageCollector(
            store,
            timestamps=RemoteTimestampSource(conn),
            locks=RemoteLockService(conn),
            retention_s=0,
            grace_ms=PASS_GRACE_MS,
        )
        return collector.run_once()
    finally:
        store.close()
        conn.close()


def last_pass(url: str) -> dict[str, Any]:
    """The last pass's report as the ``_gc`` state row records it."""
    from storage_adapters import open_store
    from txn.tables import read_state

    store = open_store(url)
    try:
        state, _ = read_state(store)
        return {"safe_point": state.safe_point, **state.last_pass}
    finally:
        store.close()


# --- one curve: commits to a store, its size at each checkpoint -----------------------


@dataclass(frozen=True, slots=True)
class Sample:
    commits: int
    size: StoreSize
    elapsed_s: float  # commit time so far (batches only, not the counting)


@dataclass(slots=True)
class Curve:
    store: str
    workload: str
    gc: str
    samples: list[Sample] = field(default_factory=list)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    passes: int = 0
    stopped: str = ""  # why the curve ended before its last checkpoint
    last_pass: dict[str, Any] = field(default_factory=dict)
    table_retention_s: float | None = None  # lakehouse: the table's log and mark retention

    @property
    def rate(self) -> float:
        last = self.samples[-1] if self.samples else None
        return last.commits / last.elapsed_s if last and last.elapsed_s else 0.0

    def at(self, commits: int) -> Sample | None:
        return next((s for s in self.samples if s.commits == commits), None)


def batch_specs(
    workload: str,
    writers: int,
    need: int,
    done_by: Sequence[int],
    seconds: float,
    gw: str,
    warehouse: str = "",
    sources: Sequence[str] = (),
) -> list[Spec]:
    """``need`` more commits split over ``writers`` (the first ones take the rest);
    each writer goes on from the commits it made so far (``done_by``); lakehouse
    writer ``i`` links ``sources[i]``."""
    cells = workload == CELLS
    return [
        Spec(
            PERCOLAKE,
            index=i,
            seconds=seconds,
            root="",
            gateway=gw,
            warehouse="" if cells else warehouse,
            table=HOT_TABLE if cells else LAKEHOUSE_TABLE,
            source="" if cells else sources[i],
            commits=need // writers + (1 if i < need % writers else 0),
            part_offset=done_by[i],
            writer=CELL_WRITER if cells else "",
        )
        for i in range(writers)
    ]


def _create_lakehouse(
    gw: str, folder: Path, retention_s: float | None = None
) -> tuple[str, list[str]]:
    """The table the appends go to (log and mark retention ``retention_s``, ``None``:
    the defaults); its warehouse and the source file each writer links. One per
    writer: ext4 takes at most 65,000 links to one inode (``os.link`` then fails with
    ``EMLINK``, and every later append of the writer fails at once), and a curve makes
    up to :data:`LAKEHOUSE_MAX_COMMITS` appends, a quarter of them per writer."""
    from pyspark.sql.types import LongType, StructField, StructType

    from spark_integration import Lakehouse, Retention
    from txn import TransactionManager

    sources = [folder / f"source-{i}.parquet" for i in range(WRITERS)]
    for source in sources:
        _write_source(source)
    warehouse = folder / "warehouse"
    with TransactionManager.remote(gw) as tm:
        Lakehouse(tm, warehouse).create_table(
            LAKEHOUSE_TABLE,
            StructType([StructField("id", LongType())]),
            retention=None if retention_s is None else Retention(retention_s, retention_s),
        )
    return str(warehouse), [str(source) for source in sources]


def measure_curve(
    pool: WriterPool,
    store: str,
    workload: str,
    gc: str,
    root: Path,
    checkpoints: Sequence[int],
    progress: Callable[[str], None],
    *,
    budget_s: float,
    at_end: Callable[[Curve, str, str], list[Result]] | None = None,
    lakehouse_retention_s: float = LAKEHOUSE_GC_RETENTION_S,
) -> tuple[Curve, list[Result]]:
    """Commit through a fresh gateway on a fresh store up to each checkpoint, reading
    the store's size at each; ``at_end(curve, url, gateway)`` runs before the gateway
    stops. With GC a lakehouse table keeps ``lakehouse_retention_s`` of log and marks."""
    folder = root / f"{store}-{workload}-{gc}"
    folder.mkdir(parents=True)
    curve = Curve(store, workload, gc)
    extra: list[Result] = []
    with store_url(store, folder) as url:
        if gc == PASSES:
            prepare_passes(url)
        args = GATEWAY_GC_ARGS if gc == GATEWAY_GC else ()
        sizes = SizeReader(store, url)
        try:
            with gateway(url, folder, f"gc-{store}-{workload}-{gc}", args) as gw:
                warehouse, sources = "", [""] * WRITERS
                if workload == LAKEHOUSE:
                    warehouse, sources = _create_lakehouse(
                        gw.address, folder, None if gc == NO_GC else lakehouse_retention_s
                    )
                    curve.table_retention_s = None if gc == NO_GC else lakehouse_retention_s
                done_by = [0] * WRITERS
                elapsed = 0.0
                for target in checkpoints:
                    need = target - sum(done_by)
                    rate = curve.rate or MIN_RATE
                    if elapsed + need / rate > budget_s:
                        curve.stopped = (
                            f"stopped before {target:,} commits: at {rate:.0f} commits/s it "
                            f"would pass the curve's budget of {budget_s / 60:.0f} min"
                        )
                        break
                    progress(f"gc {store} {workload} {gc}: to {target:,} commits")
                    specs = batch_specs(
                        workload,
                        WRITERS,
                        need,
                        done_by,
                        max(60.0, need / MIN_RATE),
                        gw.address,
                        warehouse,
                        sources,
                    )
                    started = time.monotonic()
                    got = pool.run(specs, max(s.seconds for s in specs))
                    elapsed += time.monotonic() - started
                    curve.failed += got.failed
                    curve.errors += got.errors[: 3 - len(curve.errors)]
                    per_writer = _split(got.commits, specs)
                    done_by = [d + n for d, n in zip(done_by, per_writer, strict=True)]
                    if sum(done_by) < target:
                        curve.stopped = (
                            f"stopped at {sum(done_by):,} commits: a batch to {target:,} "
                            "ran out of time"
                        )
                        break
                    if gc == PASSES:
                        gc_pass(url, gw.address)
                        curve.passes += 1
                    size = sizes.read()
                    curve.samples.append(Sample(target, size, elapsed))
                    print(
                        f"   gc {store} {workload} {gc}: {target:,} commits in {elapsed:.0f} s "
                        f"({got.failed} failed): {size.rows:,} rows ({size.describe()})",
                        file=sys.stderr,
                        flush=True,
                    )
                if gc != NO_GC:
                    curve.last_pass = last_pass(url)
                if at_end is not None and curve.samples:
                    extra = at_end(curve, url, gw.address)
        finally:
            sizes.close()
    return curve, extra


def _split(total: int, specs: Sequence[Spec]) -> list[int]:
    """Commits per writer of a batch that made ``total``: each made its share, or, if
    the batch fell short, the shortfall is taken from the last writers (only the sum
    and the part numbers' uniqueness matter)."""
    shares = [s.commits for s in specs]
    short = sum(shares) - total
    for i in reversed(range(len(shares))):
        take = min(short, shares[i])
        shares[i] -= take
        short -= take
    return shares


# --- latency of a long-history cell ---------------------------------------------------


@dataclass(slots=True)
class OpLatencies:
    get_ms: list[float] = field(default_factory=list)
    commit_ms: list[float] = field(default_factory=list)
    failed: int = 0


def time_ops(address: str, table: str, row: bytes, samples: int) -> OpLatencies:
    """``tx.get`` of the cell and ``tx.commit()`` of a transaction that rewrote it,
    alternately, ``samples`` of each (after :data:`LATENCY_WARMUP` untimed ones)."""
    from txn import TransactionManager
    from txn.errors import TransactionError

    out = OpLatencies()
    with TransactionManager.remote(address) as tm:
        for i in range(LATENCY_WARMUP + samples):
            timed = i >= LATENCY_WARMUP
            try:
                tx = tm.begin()
                began = time.perf_counter()
                value = tx.get(table, row, HOT_COLUMN)
                took = time.perf_counter() - began
                tx.commit()
                if value is None:
                    raise RuntimeError(f"the long-history cell {table}/{row!r} reads empty")
                if timed:
                    out.get_ms.append(took * 1000)
                tx = tm.begin()
                tx.put(table, row, HOT_COLUMN, i.to_bytes(VALUE_BYTES, "big"))
                began = time.perf_counter()
                tx.commit()
                if timed:
                    out.commit_ms.append((time.perf_counter() - began) * 1000)
            except TransactionError as error:
                log.warning("long-history op failed: %s", error)
                out.failed += 1
    return out


def history_results(
    url: str,
    address: str,
    store: str,
    table: str,
    row: bytes,
    versions: int,
    samples: int,
    topology: str,
) -> list[Result]:
    """Times the cell, runs one pass, times it again."""
    before = time_ops(address, table, row, samples)
    report = gc_pass(url, address)
    after = time_ops(address, table, row, samples)
    prefix = f"gc.long_history.{store}.versions{versions}"
    note = (
        f"{topology}; one cell of {versions:,} versions; {samples} timed operations of each "
        f"kind, alternating get and rewrite; one pass between 'before' and 'after' "
        f"({report.summary()})"
    )
    anchor = "the same cell before the pass, same gateway, same run"
    results: list[Result] = []
    for op, when, got in (
        ("get", "before", before.get_ms),
        ("get", "after", after.get_ms),
        ("commit", "before", before.commit_ms),
        ("commit", "after", after.commit_ms),
    ):
        ordered = sorted(got)
        for name, p in (("p50", 0.5), ("p99", 0.99)):
            value = ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]
            what = "tx.get of the cell" if op == "get" else "tx.commit() of a rewrite of it"
            results.append(
                Figure(
                    f"{prefix}.{op}.{when}.{name}_ms",
                    round(value, 3),
                    "ms",
                    len(got),
                    0.0,
                    anchor if when == "after" else "the same cell after one pass",
                    f"{what}, {when} the pass, {name} of {len(got)}; {note}",
                )
            )
    results.append(
        Figure(
            f"{prefix}.pass.seconds",
            round(report.seconds, 2),
            "s",
            1,
            0.0,
            "none: the pass's own wall time, its 200 ms grace included",
            f"a pass that deleted {report.versions_deleted:,} versions and "
            f"{report.entries_deleted:,} entries; {topology}",
        )
    )
    results.append(
        Figure(
            f"{prefix}.failed_ops",
            float(before.failed + after.failed),
            "operations",
            2,
            0.0,
            "no operation should fail",
            note,
        )
    )
    results.append(
        Latency.of(
            f"gc.long_history.{store}.latency",
            f"A cell of {versions:,} versions before and after one pass "
            f"({STORE_LABEL[store]}, through the gateway)",
            "ms",
            {
                "get, before": before.get_ms,
                "get, after": after.get_ms,
                "commit, before": before.commit_ms,
                "commit, after": after.commit_ms,
            },
            note=note,
        )
    )
    return results


def measure_history(
    pool: WriterPool, root: Path, versions: int, samples: int, progress: Callable[[str], None]
) -> list[Result]:
    """SQLite: one writer process gives one cell ``versions`` versions, then the cell
    is timed before and after one pass."""
    folder = root / "sqlite-history"
    folder.mkdir(parents=True)
    with store_url(SQLITE, folder) as url:
        prepare_passes(url)
        with gateway(url, folder, "gc-sqlite-history") as gw:
            progress(f"gc long history: writing {versions:,} versions")
            spec = Spec(
                PERCOLAKE,
                0,
                max(60.0, versions / MIN_RATE),
                "",
                gw.address,
                table=HISTORY_TABLE,
                commits=versions,
                writer=CELL_WRITER,
            )
            got = pool.run([spec], spec.seconds)
            if got.commits < versions:
                raise RuntimeError(
                    f"the long history got {got.commits} of {versions} versions: {got.errors}"
                )
            progress("gc long history: timing before and after a pass")
            return history_results(
                url,
                gw.address,
                SQLITE,
                HISTORY_TABLE,
                hot_row(0),
                versions,
                samples,
                topology(
                    SQLITE,
                    "one writer process made the history, the benchmark process "
                    "is the timed client",
                ),
            )


# --- figures --------------------------------------------------------------------------


def topology(store: str, clients: str) -> str:
    return (
        f"{clients}; each client a process with its own TransactionManager.remote, "
        f"through one 'percolake serve' process (oracle, locks, gateway) on "
        f"{STORE_LABEL[store]}, same machine (2 cores, shared)"
    )


def curve_note(curve: Curve) -> str:
    clients = f"{WRITERS} writer processes"
    note = (
        f"{topology(curve.store, clients)}; {WORKLOAD_LABEL[curve.workload]}; "
        f"{GC_LABEL[curve.gc]}; rows counted by full reads of the store between batches"
    )
    if curve.workload == LAKEHOUSE:
        note += "; the table's log and mark retention: " + (
            "the defaults (30 and 7 days)"
            if curve.table_retention_s is None
            else f"{curve.table_retention_s:g} s (expired with its checkpoints)"
        )
    if curve.gc != NO_GC and curve.last_pass:
        note += f"; last pass recorded: {curve.last_pass}"
    if curve.stopped:
        note += f"; {curve.stopped}"
    return note


def _label(curve: Curve) -> str:
    gc = "no GC" if curve.gc == NO_GC else "GC"
    return f"{STORE_LABEL[curve.store]}, {gc}"


def curve_figures(curves: Sequence[Curve], reported: Sequence[int]) -> list[Result]:
    results: list[Result] = []
    by_key = {(c.store, c.workload, c.gc): c for c in curves}
    for curve in curves:
        name = f"{curve.workload}.{curve.store}"
        suffix = "without_gc" if curve.gc == NO_GC else "with_gc"
        note = curve_note(curve)
        for commits in reported:
            sample = curve.at(commits)
            if sample is None:
                continue
            size = sample.size
            results.append(
                Figure(
                    f"gc.store_rows.{name}.commits{commits}.{suffix}",
                    float(size.rows),
                    "rows",
                    1,
                    0.0,
                    "the same commits without garbage collection, same run"
                    if curve.gc != NO_GC
                    else "none: what garbage collection is measured against",
                    f"after {commits:,} commits: {size.describe()}; {note}",
                )
            )
            if size.bytes_used is not None:
                results.append(
                    Figure(
                        f"gc.store_bytes.{name}.commits{commits}.{suffix}",
                        float(size.bytes_used),
                        "bytes",
                        1,
                        0.0,
                        "the same, without garbage collection",
                        f"SQLite pages in use (page_count - freelist_count) x page_size after "
                        f"{commits:,} commits; files on disk {size.file_bytes:,} bytes "
                        f"(database and WAL; freed pages stay in the file); {note}",
                    )
                )
        if curve.samples:
            results.append(
                Figure(
                    f"gc.commits_per_s.{name}.{suffix}",
                    round(curve.rate, 1),
                    "commits/s",
                    len(curve.samples),
                    0.0,
                    "the same commits without garbage collection, same run",
                    f"{curve.samples[-1].commits:,} commits over {curve.samples[-1].elapsed_s:.0f} "
                    f"s of batches; {note}",
                )
            )
        results.append(
            Figure(
                f"gc.failed_commits.{name}.{suffix}",
                float(curve.failed),
                "commits",
                1,
                0.0,
                "none should fail without conflicts; with GC a transaction left below the "
                "safe point ends with SnapshotTooOldError",
                f"first errors: {' | '.join(curve.errors) or 'none'}; {note}",
            )
        )
        if curve.gc != NO_GC and (without := by_key.get((curve.store, curve.workload, NO_GC))):
            shared = [(w, s) for s in curve.samples if (w := without.at(s.commits)) is not None]
            if curve.workload == LAKEHOUSE and any(
                w.commits == LAKEHOUSE_RATIO_AT for w, _ in shared
            ):
                shared = [(w, s) for w, s in shared if w.commits <= LAKEHOUSE_RATIO_AT]
            if shared:
                at, sample = shared[-1][0].commits, shared[-1][1]
                ratio = sample.size.rows / shared[-1][0].size.rows
                contract = curve.store == SQLITE and curve.workload == CELLS
                results.append(
                    Figure(
                        "gc.store_rows.with_vs_without.ratio"
                        if contract
                        else f"gc.store_rows.{name}.with_vs_without.ratio",
                        round(ratio, 5),
                        "x",
                        1,
                        0.0,
                        f"the same {at:,} commits without garbage collection, same run "
                        f"({shared[-1][0].size.rows:,} rows)",
                        f"store rows after {at:,} {WORKLOAD_LABEL[curve.workload]}, with GC / "
                        f"without (lower is better); with: {curve_note(curve)}",
                    )
                )
                results.append(
                    Figure(
                        f"gc.commits_per_s.{name}.with_vs_without.ratio",
                        round(curve.rate / without.rate, 3) if without.rate else 0.0,
                        "x",
                        1,
                        0.0,
                        "the same commits without garbage collection, same run",
                        f"commits/s with GC / without (1.0: collection costs the writers "
                        f"nothing); {curve_note(curve)}",
                    )
                )
    for workload in (CELLS, LAKEHOUSE):
        lines = {
            _label(c): [(float(s.commits), float(s.size.rows)) for s in c.samples]
            for c in curves
            if c.workload == workload and c.samples
        }
        if lines:
            results.append(
                Growth(
                    f"gc.store_rows.{workload}.by_commits",
                    f"Store rows by commits, {WORKLOAD_LABEL[workload]}, with and without GC",
                    "commits",
                    "rows in the store",
                    lines,
                    log_y=True,
                    note=f"{WRITERS} writer processes through one 'percolake serve'; with GC: "
                    f"{GC_LABEL[GATEWAY_GC]} (quick mode: {GC_LABEL[PASSES]})",
                )
            )
    return results


def _history_at_curve_end(
    store: str, samples: int, progress: Callable[[str], None]
) -> Callable[[Curve, str, str], list[Result]]:
    """Times hot cell 0 at the end of a curve without GC (writer 0 made a quarter of
    the commits, the odd ones first), a pass between."""

    def at_end(curve: Curve, url: str, address: str) -> list[Result]:
        commits = curve.samples[-1].commits
        versions = commits // WRITERS + (1 if commits % WRITERS else 0)
        progress(f"gc long history on {store}: before and after a pass")
        clients = (
            f"{WRITERS} writer processes made the history (hot cell 0 at the end of the "
            "curve without GC), the benchmark process is the timed client"
        )
        return history_results(
            url, address, store, HOT_TABLE, hot_row(0), versions, samples, topology(store, clients)
        )

    return at_end


# --- the suite ------------------------------------------------------------------------


def run(
    quick: bool,
    progress: Callable[[str], None] = lambda _: None,
    *,
    stores: Sequence[str] | None = None,
    workloads: Sequence[str] | None = None,
    max_commits: int | None = None,
    history: bool = True,
    curves_of: Sequence[str] = ("without", "with"),
    lakehouse_retention_s: float = LAKEHOUSE_GC_RETENTION_S,
) -> list[Result]:
    """The suite (the keywords narrow it, for the command line)."""
    checkpoints = [c for c in (QUICK_CHECKPOINTS if quick else CHECKPOINTS)]
    if max_commits is not None:
        checkpoints = [c for c in checkpoints if c <= max_commits]
    reported = checkpoints if quick else [c for c in REPORTED if c in checkpoints]
    chosen_stores = tuple(stores or ((SQLITE,) if quick else (SQLITE, CASSANDRA1)))
    chosen = tuple(workloads or ((CELLS,) if quick else (CELLS, LAKEHOUSE)))
    with_gc = PASSES if quick else GATEWAY_GC
    curves: list[Curve] = []
    results: list[Result] = []
    progress("gc: starting writer processes")
    with (
        tempfile.TemporaryDirectory(prefix="percolake-gc-") as tmp,
        WriterPool(WRITERS, (PERCOLAKE,)) as pool,
    ):
        root = Path(tmp)
        for store in chosen_stores:
            for workload in chosen:
                points = [
                    c
                    for c in checkpoints
                    if (store == SQLITE or c <= CASSANDRA_MAX_COMMITS)
                    and (workload == CELLS or c <= LAKEHOUSE_MAX_COMMITS)
                ]
                for gc in (NO_GC, with_gc):
                    if ("without" if gc == NO_GC else "with") not in curves_of:
                        continue
                    at_end = None
                    if store != SQLITE and workload == CELLS and gc == NO_GC and history:
                        at_end = _history_at_curve_end(
                            store, QUICK_LATENCY_SAMPLES if quick else LATENCY_SAMPLES, progress
                        )
                    curve, extra = measure_curve(
                        pool,
                        store,
                        workload,
                        gc,
                        root,
                        points,
                        progress,
                        budget_s=CURVE_BUDGET_S[store],
                        at_end=at_end,
                        lakehouse_retention_s=lakehouse_retention_s,
                    )
                    curves.append(curve)
                    results += extra
        if history and SQLITE in chosen_stores:
            results += measure_history(
                pool,
                root,
                QUICK_HISTORY_VERSIONS if quick else HISTORY_VERSIONS,
                QUICK_LATENCY_SAMPLES if quick else LATENCY_SAMPLES,
                progress,
            )
    return curve_figures(curves, reported) + results


def main(argv: Sequence[str] | None = None) -> int:
    from bench.__main__ import finish_command

    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_gc",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--store", action="append", choices=[SQLITE, CASSANDRA1])
    parser.add_argument("--workload", action="append", choices=[CELLS, LAKEHOUSE])
    parser.add_argument("--max-commits", type=int, help="stop the curves at this checkpoint")
    parser.add_argument("--no-history", action="store_true", help="skip the long-history part")
    parser.add_argument(
        "--curves",
        choices=["with", "without"],
        action="append",
        help="only the curves with (or without) garbage collection (default: both)",
    )
    parser.add_argument(
        "--lakehouse-retention-s",
        type=float,
        default=LAKEHOUSE_GC_RETENTION_S,
        help="with GC, the lakehouse table's log and mark retention "
        f"(default {LAKEHOUSE_GC_RETENTION_S:g})",
    )
    parser.add_argument(
        "--write", action="store_true", help="merge the figures into bench/results/latest.json"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    results = run(
        args.quick,
        progress=lambda step: print(f"   {step} ...", file=sys.stderr, flush=True),
        stores=args.store,
        workloads=args.workload,
        max_commits=args.max_commits,
        history=not args.no_history,
        curves_of=args.curves or ("without", "with"),
        lakehouse_retention_s=args.lakehouse_retention_s,
    )
    return finish_command(results, started=started, write=args.write, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
