"""Lakehouse tables against Delta Lake (delta-rs) and Apache Iceberg (pyiceberg), side
by side on this machine, in the same run.

percolake's side is ``spark_integration.Lakehouse`` with an embedded manager on SQLite.
Delta Lake's is delta-rs on local disk. Iceberg's is pyiceberg with a ``SqlCatalog`` on
SQLite and a local file warehouse. Every ratio pairs runs made back to back, with the
order of the systems rotated from run to run; each says which way round it is.

* Appends: one-file, metadata-only commits to one table by 1, 2, 4 and 8 threads of
  one process, each thread with its own table handle. percolake: ``append_files`` of
  one ``DataFile``; Delta: ``create_write_transaction`` with one ``AddAction``; Iceberg:
  ``Table.add_files([path], check_duplicate_files=False)``, a fast append. ``add_files``
  reads the file's Parquet footer, so each path is a fresh hard link of one 10-row
  file. pyiceberg retries a conflicting commit itself (4 times, backoff from 100 ms);
  a commit that still fails is retried here on a reloaded table, up to 20 times. Every
  commit's wall time is kept for the latency distributions.
* Listing the live files after N one-file commits to a table, each listing from a cold
  start: a fresh manager on the store, a fresh ``DeltaTable``, a fresh catalog object
  with ``load_table`` and ``scan().plan_files()``. N is 10, 100, 1,000 and 100,000
  (quick mode: 10,000 at most), plus 500 in full mode. percolake's and Iceberg's
  commits are real (``append_files``; ``add_files`` as above). Delta's log is written
  in the exact JSON delta-rs wrote for its own first append (paths and times changed)
  and checkpointed by delta-rs where its default ``checkpointInterval`` of 100 would:
  real delta-rs commits run at ~50/s, so 100,000 of them would take over half an hour
  for a state that reads the same. Iceberg is measured only up to 100 (quick) or 500
  (full) commits: pyiceberg deep-copies the whole table metadata, every snapshot in
  it, several times per commit, so each commit costs more than the one before (the
  notes give the first and last commits' times; 1,000 commits took over five minutes
  on the two-core machine this benchmark was written on).
* Snapshot reads: K commits (quick 20, full 100) of R rows each (quick 10,000, full
  50,000; columns id, k, s, x), the same rows in all three tables. percolake:
  Parquet files written with pyarrow into job folders, committed by ``append_files``;
  Delta: ``write_deltalake(mode="append")``; Iceberg: ``Table.append``. Then the
  latest version and version K/2 are read into a pyarrow Table, cold: ``files()`` of
  a fresh manager read with ``pyarrow.dataset``, ``DeltaTable(path, version=v)
  .to_pyarrow_table()``, ``scan(snapshot_id=...).to_arrow()`` through a fresh catalog.
  Row counts and sums of ``id`` must agree across the systems.
* Spark, one local[2] session and one DataFrame: ``lh.append`` against a plain
  ``df.write.parquet`` (the commit hook's overhead, and its fixed cost bracketed by
  the hook's before/after-write fail points), and end to end against Delta
  (``df.write.parquet`` into the table folder, then one delta-rs commit adding the part
  files) and Iceberg (``df.write.parquet`` into the table's data folder, then one
  ``add_files``). Each table's row count is checked from its files' footers after.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench._lakehouse_anchors import (
    ICEBERG_ATTEMPTS,
    DeltaAppends,
    DeltaSnapshots,
    DeltaSparkCommits,
    IcebergAppends,
    IcebergSnapshots,
    IcebergSparkCommits,
    footer_rows,
    pyiceberg_retries,
    version_of,
)
from bench._load import run_threads
from bench._results import Growth, Latency, Result, summarize
from spark_integration import DataFile, Lakehouse
from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.spark.session import local_session
from txn import TransactionManager

log = logging.getLogger(__name__)

TABLE = "events"
#: The systems, as labelled in the plots; figures name percolake's side "lakehouse".
PERCOLAKE, DELTA, ICEBERG = "percolake", "deltalake", "iceberg"
SYSTEMS = (PERCOLAKE, DELTA, ICEBERG)
PREFIX = {PERCOLAKE: "lakehouse", DELTA: "deltalake", ICEBERG: "iceberg"}

DELTA_RS = f"delta-rs {version_of('deltalake')}"
PYICEBERG = f"pyiceberg {version_of('pyiceberg')} SqlCatalog on SQLite, local file warehouse"

APPEND_DELTA = (
    f"Delta Lake ({DELTA_RS} create_write_transaction, one AddAction per commit, local "
    "disk, same run); the design target: about 60-70 metadata-only commits/s, one writer or eight"
)
APPEND_ICEBERG = (
    f"Apache Iceberg ({PYICEBERG}): Table.add_files of one 10-row Parquet file per commit "
    "(a fresh hard link of one file: add_files reads its footer), fast append, same run"
)
APPEND_BOTH = f"{APPEND_DELTA}; {APPEND_ICEBERG}"
LIST_DELTA = (
    f"Delta Lake ({DELTA_RS} DeltaTable(path).file_uris() from a cold start, same run, log "
    "checkpointed every 100 commits as delta-rs does by default)"
)
LIST_ICEBERG = (
    f"Apache Iceberg ({PYICEBERG}): fresh catalog object, load_table, scan().plan_files() "
    "after N real add_files commits (one manifest each, pyiceberg's default fast append)"
)
READ_DELTA = (
    f"Delta Lake ({DELTA_RS}): DeltaTable(path, version=v).to_pyarrow_table() from a cold "
    "start, same rows written by write_deltalake, same run"
)
READ_ICEBERG = (
    f"Apache Iceberg ({PYICEBERG}): fresh catalog, load_table, scan(snapshot_id=...)"
    ".to_arrow(), same rows written by Table.append, same run"
)
SPARK_ANCHOR = "plain df.write.parquet of the same DataFrame, same local[2] session, same run"
E2E_DELTA = (
    f"Delta Lake end to end: df.write.parquet into the table folder, then one {DELTA_RS} "
    "create_write_transaction adding the part files (sizes from the file system, "
    "numRecords from their footers); same DataFrame, same local[2] session, same run"
)
E2E_ICEBERG = (
    "Apache Iceberg end to end: df.write.parquet into the table's data folder, then one "
    f"Table.add_files of the part files (it reads their footers), {PYICEBERG}; same "
    "DataFrame, same local[2] session, same run"
)

T = TypeVar("T")


def _rotated(items: Sequence[T], by: int) -> list[T]:
    """``items`` rotated left by ``by``: run ``n`` starts with a different system."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _spark_schema() -> Any:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("id", LongType()),
            StructField("k", LongType()),
            StructField("s", StringType()),
            StructField("x", DoubleType()),
        ]
    )


def _arrow_schema() -> Any:
    """The arrow twin of :func:`_spark_schema` (and of the Spark benchmark's DataFrame)."""
    import pyarrow as pa

    return pa.schema(
        [("id", pa.int64()), ("k", pa.int64()), ("s", pa.string()), ("x", pa.float64())]
    )


def _batch(index: int, rows: int) -> Any:
    """Rows ``index * rows`` up to the next batch: id, id % 97, str(id * 7), a double."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = np.arange(index * rows, (index + 1) * rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "k": ids % 97,
            "s": pc.cast(pa.array(ids * 7), pa.string()),
            "x": np.random.default_rng(index).random(rows),
        },
        schema=_arrow_schema(),
    )


# --- commits per second ----------------------------------------------------------------


# --- percolake side --------------------------------------------------------------------


class _Percolake:
    """A fresh store, warehouse and table (one ``id`` column unless told) in ``root``."""

    def __init__(self, root: Path, schema: Any = None) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        self.url = f"sqlite:///{root}/store.db"
        self.warehouse = root / "warehouse"
        self.tm = TransactionManager.embedded(self.url)
        self.lh = Lakehouse(self.tm, self.warehouse)
        if schema is None:
            schema = StructType([StructField("id", LongType())])
        self.lh.create_table(TABLE, schema)
        self.location = self.warehouse / TABLE
        self.folder = f"{self.location}/_lh_job=bench"

    def append(self, n: int) -> None:
        path = f"{self.folder}/part-{n:08d}.parquet"
        self.lh.append_files(TABLE, [DataFile(path, 1000, 10)])

    def append_batch(self, n: int, batch: Any) -> None:
        """Write ``batch`` as one Parquet file in a job folder of its own; commit it."""
        import pyarrow.parquet as pq

        folder = self.location / f"_lh_job=batch-{n:05d}"
        folder.mkdir(parents=True)
        path = str(folder / "part-00000.parquet")
        pq.write_table(batch, path)
        self.lh.append_files(TABLE, [DataFile(path, os.path.getsize(path), batch.num_rows)])

    @contextlib.contextmanager
    def _cold(self) -> Iterator[None]:
        """Close this process's manager so that a cold one can open the store.

        One oracle per SQLite store (S7): a second embedded manager on the same file
        is refused while the first is open. Reopening is outside the timed part.
        """
        self.tm.close()
        try:
            yield
        finally:
            self.tm = TransactionManager.embedded(self.url)
            self.lh = Lakehouse(self.tm, self.warehouse)

    def list_cold(self) -> tuple[float, int]:
        with self._cold():
            started = time.perf_counter()
            with TransactionManager.embedded(self.url) as tm:
                count = len(Lakehouse(tm, self.warehouse).files(TABLE))
                elapsed = time.perf_counter() - started
        return elapsed, count

    def list_warm(self) -> tuple[float, int]:
        started = time.perf_counter()
        count = len(self.lh.files(TABLE))
        return time.perf_counter() - started, count

    def read_cold(self, version: int | None) -> Any:
        import pyarrow.dataset as ds

        with self._cold(), TransactionManager.embedded(self.url) as tm:
            files = Lakehouse(tm, self.warehouse).files(TABLE, version)
        return ds.dataset([f.path for f in files], format="parquet").to_table()

    def close(self) -> None:
        self.tm.close()


# --- appends ---------------------------------------------------------------------------


@dataclass(slots=True)
class _AppendStats:
    rates: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SYSTEMS})
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SYSTEMS, 0))
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SYSTEMS})
    reloads: int = 0  # Iceberg commits retried here after pyiceberg gave up


def _append_run(system: str, root: Path, writers: int, seconds: float, stats: _AppendStats) -> None:
    if system == PERCOLAKE:
        pl = _Percolake(root)
        try:
            run = run_threads(pl.append, writers, seconds)
        finally:
            pl.close()
    elif system == DELTA:
        delta = DeltaAppends(root)
        run = run_threads(delta.append, writers, seconds, delta.open)
    else:
        ice = IcebergAppends(root)
        try:
            run = run_threads(ice.append, writers, seconds, ice.open)
        finally:
            ice.close()
        stats.reloads += ice.reloads
    stats.rates[system].append(run.rate)
    stats.failed[system] += run.failed
    stats.latencies_ms[system] += run.latencies_ms


def bench_appends(quick: bool, progress: Callable[[str], None]) -> list[Result]:
    seconds = 1.0 if quick else 3.0
    runs = 1 if quick else 2
    writer_counts = (1, 2, 4, 8)
    by_writers: dict[int, _AppendStats] = {}
    results: list[Result] = []
    with pyiceberg_retries() as retries:
        for i, writers in enumerate(writer_counts):
            progress(f"lakehouse.appends.writers{writers}")
            stats = by_writers[writers] = _AppendStats()
            before = retries.count
            for run in range(runs):
                for system in _rotated(SYSTEMS, i + run):
                    with tempfile.TemporaryDirectory() as tmp:
                        _append_run(system, Path(tmp), writers, seconds, stats)
            internal = retries.count - before
            log.info("appends, %d writers: %s", writers, stats.rates)
            if writers not in (1, 8):
                continue
            note = (
                f"{runs} run(s) of {seconds:g} s per system, each on a new empty table; "
                f"one-file metadata-only commits, {writers} thread(s) of one process; "
                f"failed commits: percolake {stats.failed[PERCOLAKE]}, deltalake "
                f"{stats.failed[DELTA]}, iceberg {stats.failed[ICEBERG]} (pyiceberg retried "
                f"{internal} conflicting commits itself, {stats.reloads} more were retried on "
                f"a reloaded table, at most {ICEBERG_ATTEMPTS} times each); pyiceberg's commit "
                "cost grows with the snapshots already in the table"
            )
            rates = stats.rates
            anchors = {PERCOLAKE: APPEND_BOTH, DELTA: APPEND_DELTA, ICEBERG: APPEND_ICEBERG}
            results += [
                summarize(
                    f"{PREFIX[system]}.appends.writers{writers}.commits_per_s",
                    "commits/s",
                    anchors[system],
                    rates[system],
                    note,
                )
                for system in SYSTEMS
            ]
            # The contract's lakehouse.appends.writers8.vs_deltalake.ratio is measured
            # in the deployed topology (bench.bench_lakehouse_deployed); this one is
            # threads of one process, so it keeps its figure under its own name.
            inprocess = {(8, DELTA): "inprocess."}
            results += [
                summarize(
                    f"lakehouse.appends.{inprocess.get((writers, anchor), '')}"
                    f"writers{writers}.vs_{PREFIX[anchor]}.ratio",
                    "x",
                    anchors[anchor],
                    [a / b for a, b in zip(rates[PERCOLAKE], rates[anchor], strict=True)],
                    f"{note}; percolake commits/s / {PREFIX[anchor]} commits/s, of paired runs",
                )
                for anchor in (DELTA, ICEBERG)
            ]
    growth_note = (
        f"medians of {runs} run(s) of {seconds:g} s per system and writer count, each on a "
        "new empty table; threads of one process, each with its own table handle"
    )
    results.append(
        Growth(
            "lakehouse.appends.by_writers",
            "One-file metadata-only appends to one table, by concurrent writers",
            "concurrent writers (threads)",
            "commits/s",
            {
                s: [(float(w), _median(by_writers[w].rates[s])) for w in writer_counts]
                for s in SYSTEMS
            },
            log_y=True,
            note=growth_note,
        )
    )
    for writers, suffix in ((1, ""), (8, ".writers8")):
        stats = by_writers[writers]
        results.append(
            Latency.of(
                f"lakehouse.append.latency{suffix}",
                f"One-file append commit latency, {writers} writer{'s' if writers > 1 else ''}",
                "ms",
                {system: ms for system, ms in stats.latencies_ms.items() if ms},
                note=f"wall time of every successful commit (Iceberg: with its retries), "
                f"{runs} run(s) of {seconds:g} s per system",
            )
        )
    return results


# --- listing ---------------------------------------------------------------------------


def bench_listing(quick: bool, progress: Callable[[str], None]) -> list[Result]:
    iceberg_counts = (10, 100) if quick else (10, 100, 500)
    counts = (10, 100, 1_000, 10_000) if quick else (10, 100, 500, 1_000, 100_000)
    runs = 3 if quick else 5
    results: list[Result] = []
    lines: dict[str, list[tuple[float, float]]] = {s: [] for s in SYSTEMS}
    for commits in counts:
        progress(f"lakehouse.list_files.commits{commits}")
        with tempfile.TemporaryDirectory() as tmp:
            pl = _Percolake(Path(tmp))
            ice: IcebergAppends | None = None
            try:
                started = time.monotonic()
                for n in range(commits):
                    pl.append(n)
                setup_s = time.monotonic() - started
                delta = DeltaAppends(Path(tmp))
                delta.synthesize(commits)
                ice_commit_s: list[float] = []
                if commits in iceberg_counts:
                    ice = IcebergAppends(Path(tmp))
                    for n in range(commits):
                        started = time.perf_counter()
                        ice.append(n)
                        ice_commit_s.append(time.perf_counter() - started)
                # Paired runs, the systems' order rotated from run to run.
                cold: list[tuple[float, int]] = []
                theirs: list[tuple[float, int]] = []
                iceberg: list[tuple[float, int]] = []
                listers: list[tuple[Callable[[], tuple[float, int]], list[tuple[float, int]]]]
                listers = [(pl.list_cold, cold), (delta.list_cold, theirs)]
                if ice is not None:
                    listers.append((ice.list_cold, iceberg))
                for run in range(runs):
                    for lister, sink in _rotated(listers, run):
                        sink.append(lister())
                warm = [pl.list_warm() for _ in range(runs)]
            finally:
                pl.close()
                if ice is not None:
                    ice.close()
        assert {n for _, n in cold + warm + theirs + iceberg} == {commits}
        ours_ms = [s * 1000 for s, _ in cold]
        theirs_ms = [s * 1000 for s, _ in theirs]
        note = (
            f"{commits} one-file commits; percolake made them in {setup_s:.2f} s "
            f"({commits / setup_s:.0f} commits/s); cold = fresh manager / fresh DeltaTable"
        )
        if quick and commits == counts[-1]:
            note += "; quick mode: 10,000 commits instead of 100,000"
        lines[PERCOLAKE].append((float(commits), _median(ours_ms)))
        lines[DELTA].append((float(commits), _median(theirs_ms)))
        results += [
            summarize(f"lakehouse.list_files.commits{commits}.ms", "ms", LIST_DELTA, ours_ms, note),
            summarize(
                f"lakehouse.list_files.commits{commits}.warm.ms",
                "ms",
                LIST_DELTA,
                [s * 1000 for s, _ in warm],
                note + "; warm = the manager that made the commits (status cache filled)",
            ),
            summarize(
                f"deltalake.list_files.commits{commits}.ms", "ms", LIST_DELTA, theirs_ms, note
            ),
            summarize(
                f"lakehouse.list_files.commits{commits}.vs_deltalake.ratio",
                "x",
                LIST_DELTA,
                [t / o for t, o in zip(theirs_ms, ours_ms, strict=True)],
                note + f"; deltalake time / percolake time, {runs} paired runs",
            ),
        ]
        if iceberg:
            ice_ms = [s * 1000 for s, _ in iceberg]
            tail = min(10, commits)
            ice_note = (
                f"{commits} one-file add_files commits, made by pyiceberg in "
                f"{sum(ice_commit_s):.1f} s: {_median(ice_commit_s[:tail]) * 1000:.0f} ms per "
                f"commit over the first {tail}, {_median(ice_commit_s[-tail:]) * 1000:.0f} ms "
                f"over the last {tail}; cold = fresh catalog object; percolake's side as in "
                f"lakehouse.list_files.commits{commits}.ms; Iceberg is measured only up to "
                f"{iceberg_counts[-1]} commits in this mode, as pyiceberg's commit cost grows "
                "with the snapshots already in the table"
            )
            lines[ICEBERG].append((float(commits), _median(ice_ms)))
            results += [
                summarize(
                    f"iceberg.list_files.commits{commits}.ms", "ms", LIST_ICEBERG, ice_ms, ice_note
                ),
                summarize(
                    f"lakehouse.list_files.commits{commits}.vs_iceberg.ratio",
                    "x",
                    LIST_ICEBERG,
                    [i / o for i, o in zip(ice_ms, ours_ms, strict=True)],
                    ice_note + f"; iceberg time / percolake time, {runs} paired runs",
                ),
            ]
    results.append(
        Growth(
            "lakehouse.list_files.by_commits",
            "Listing a table's live files from a cold start, by commits to the table",
            "one-file commits to the table",
            "ms (median)",
            lines,
            log_y=True,
            note=f"medians of {runs} cold listings; Iceberg up to {iceberg_counts[-1]} commits "
            "(pyiceberg's commit cost grows with the snapshot count); Delta's log synthesized "
            "from delta-rs's own first commit, checkpointed every 100 versions",
        )
    )
    return results


# --- snapshot reads --------------------------------------------------------------------


def bench_snapshot_reads(quick: bool, progress: Callable[[str], None]) -> list[Result]:
    commits = 20 if quick else 100
    rows = 10_000 if quick else 50_000
    runs = 3 if quick else 7
    old = commits // 2
    progress("lakehouse.snapshot_read")
    ms: dict[tuple[str, str], list[float]] = {
        (s, which): [] for s in SYSTEMS for which in ("latest", "old")
    }
    made_s = dict.fromkeys(SYSTEMS, 0.0)
    with tempfile.TemporaryDirectory() as tmp, pyiceberg_retries():
        root = Path(tmp)
        pl = _Percolake(root, _spark_schema())
        try:
            delta = DeltaSnapshots(root, _arrow_schema())
            ice = IcebergSnapshots(root, _arrow_schema())
            with ice.table() as ice_table:
                for n in range(commits):
                    batch = _batch(n, rows)
                    for system, write in (
                        (PERCOLAKE, lambda b, n=n: pl.append_batch(n, b)),
                        (DELTA, delta.append),
                        (ICEBERG, ice_table.append),
                    ):
                        started = time.perf_counter()
                        write(batch)
                        made_s[system] += time.perf_counter() - started
            snapshot_ids = ice.snapshot_ids()
            assert len(snapshot_ids) == commits and pl.lh.version(TABLE) == commits
            readers: dict[str, Callable[[int | None], Any]] = {
                PERCOLAKE: pl.read_cold,
                DELTA: delta.read_cold,
                ICEBERG: lambda v: ice.read_cold(snapshot_ids[-1 if v is None else v - 1]),
            }
            sums: dict[tuple[str, str], int] = {}
            for run in range(runs):
                for system in _rotated(SYSTEMS, run):
                    for which, version in (("latest", None), ("old", old)):
                        started = time.perf_counter()
                        table = readers[system](version)
                        ms[system, which].append((time.perf_counter() - started) * 1000)
                        want = (commits if which == "latest" else old) * rows
                        assert table.num_rows == want, (system, which, table.num_rows, want)
                        if run == 0:
                            sums[system, which] = int(table["id"].to_numpy().sum())
                        del table
            for which in ("latest", "old"):
                assert len({sums[s, which] for s in SYSTEMS}) == 1, sums
        finally:
            pl.close()
    size = f"{commits} commits of {rows:,} rows (id, k, s, x): {commits * rows:,} rows"
    note = (
        f"{size}; latest = version {commits}, old = version {old}; {runs} cold reads of each "
        "per system, system order rotated per run; tables made in "
        + ", ".join(f"{s} {made_s[s]:.1f} s" for s in SYSTEMS)
    )
    results: list[Result] = []
    for which in ("latest", "old"):
        ours = ms[PERCOLAKE, which]
        results.append(
            summarize(
                f"lakehouse.snapshot_read.{which}.ms",
                "ms",
                f"{READ_DELTA}; {READ_ICEBERG}",
                ours,
                note + "; percolake: files() of a fresh manager, read with pyarrow.dataset",
            )
        )
        for system, anchor in ((DELTA, READ_DELTA), (ICEBERG, READ_ICEBERG)):
            theirs = ms[system, which]
            results += [
                summarize(f"{system}.snapshot_read.{which}.ms", "ms", anchor, theirs, note),
                summarize(
                    f"lakehouse.snapshot_read.{which}.vs_{system}.ratio",
                    "x",
                    anchor,
                    [t / o for t, o in zip(theirs, ours, strict=True)],
                    note + f"; {system} time / percolake time of paired runs (> 1: percolake "
                    "faster)",
                ),
            ]
    return results


# --- Spark -----------------------------------------------------------------------------


def bench_spark(quick: bool, progress: Callable[[str], None]) -> list[Result]:
    # Full mode: large enough that one write takes seconds, so the commits' fixed
    # costs (the hook's three small transactions and footer reads; the anchors' footer
    # reads and commits) are measured against a real job, and a busy machine's noise
    # averages out over the runs. Quick mode only checks that every path works.
    rows = 300_000 if quick else 8_000_000
    runs = 2 if quick else 7
    progress("spark.commit_hook.overhead")
    spark = local_session("percolake-bench", **{"spark.driver.memory": "2g"})
    try:
        df = spark.range(0, rows, 1, 4).selectExpr(
            "id", "id % 97 AS k", "CAST(id * 7 AS STRING) AS s", "rand(1) AS x"
        )
        with (
            tempfile.TemporaryDirectory() as tmp,
            pyiceberg_retries() as retries,
            contextlib.ExitStack() as closing,
        ):
            root = Path(tmp)
            tm = closing.enter_context(TransactionManager.embedded(f"sqlite:///{tmp}/store.db"))
            ice = IcebergSparkCommits(root, _arrow_schema())
            closing.callback(ice.close)
            lh = Lakehouse(tm, f"{tmp}/warehouse")
            lh.create_table(TABLE, df.schema)
            delta = DeltaSparkCommits(root, _arrow_schema())
            plain_dirs: Iterator[str] = (f"{tmp}/plain/{n}" for n in itertools.count())

            def plain() -> float:
                started = time.perf_counter()
                df.write.parquet(next(plain_dirs))
                return time.perf_counter() - started

            # The hook's own cost: lh.append minus the Spark write inside it, which
            # the before_write and after_write points bracket exactly.
            write_started: list[float] = []
            write_s: list[float] = []
            lh.failpoints.enable(
                fp.BEFORE_WRITE, lambda _: write_started.append(time.perf_counter())
            )
            lh.failpoints.enable(
                fp.AFTER_WRITE,
                lambda _: write_s.append(time.perf_counter() - write_started[-1]),
            )
            commit_ms: dict[str, list[float]] = {s: [] for s in SYSTEMS}

            def hooked() -> float:
                started = time.perf_counter()
                lh.append(TABLE, df)
                took = time.perf_counter() - started
                commit_ms[PERCOLAKE].append((took - write_s[-1]) * 1000)
                return took

            def anchored(
                system: str, job_dir: Callable[[], str], commit: Callable[[str], None]
            ) -> Callable[[], float]:
                def once() -> float:
                    folder = job_dir()
                    started = time.perf_counter()
                    df.write.parquet(folder)
                    written = time.perf_counter()
                    commit(folder)
                    done = time.perf_counter()
                    commit_ms[system].append((done - written) * 1000)
                    return done - started

                return once

            jobs: dict[str, Callable[[], float]] = {
                "plain": plain,
                PERCOLAKE: hooked,
                DELTA: anchored(DELTA, delta.next_job_dir, delta.commit),
                ICEBERG: anchored(ICEBERG, ice.next_job_dir, ice.commit),
            }
            for job in jobs.values():  # warm up the JVM, the Python workers, each path
                job()
            for samples in commit_ms.values():
                samples.clear()
            seconds: dict[str, list[float]] = {name: [] for name in jobs}
            for n in range(runs):
                # Rotate which goes first, so none always gets a warmer cache.
                for name in _rotated(list(jobs), n):
                    seconds[name].append(jobs[name]())
            progress("spark.e2e.verify")
            want = (runs + 1) * rows
            counted = {
                PERCOLAKE: footer_rows([f.path for f in lh.files(TABLE)]),
                DELTA: delta.rows(),
                ICEBERG: ice.rows(),
            }
            assert all(c == want for c in counted.values()), (counted, want)
    finally:
        spark.stop()
    size = (
        f"{rows:,} rows x 4 columns, 4 files per write, local[2]; {runs} runs after one "
        "warm-up of each, order rotated per run"
    )
    checked = f"; each table then held (runs + 1) x {rows:,} rows, as its files' footers show"
    e2e_note = (
        f"{size}; the Spark write plus the commit; iceberg's commit saw {retries.count} "
        f"conflict retries{checked}"
    )
    fixed_note = (
        "lh.append wall time minus its Spark write: prepare and commit transactions, "
        "schema check, footer reads, commit_ts record; same runs"
    )
    ours = seconds[PERCOLAKE]
    return [
        summarize(
            "spark.commit_hook.overhead.ratio",
            "x",
            SPARK_ANCHOR,
            [h / p for p, h in zip(seconds["plain"], ours, strict=True)],
            size + "; lh.append time / df.write.parquet time of paired runs",
        ),
        summarize("spark.df_write_parquet.seconds", "s", SPARK_ANCHOR, seconds["plain"], size),
        summarize("spark.lakehouse_append.seconds", "s", SPARK_ANCHOR, ours, size),
        summarize(
            "spark.commit_hook.fixed_ms", "ms", SPARK_ANCHOR, commit_ms[PERCOLAKE], fixed_note
        ),
        summarize(
            "spark.e2e.lakehouse.seconds", "s", f"{E2E_DELTA}; {E2E_ICEBERG}", ours, e2e_note
        ),
        summarize("spark.e2e.deltalake.seconds", "s", E2E_DELTA, seconds[DELTA], e2e_note),
        summarize("spark.e2e.iceberg.seconds", "s", E2E_ICEBERG, seconds[ICEBERG], e2e_note),
        summarize(
            "spark.e2e.vs_deltalake.ratio",
            "x",
            E2E_DELTA,
            [t / o for t, o in zip(seconds[DELTA], ours, strict=True)],
            e2e_note + "; deltalake time / percolake time of paired runs (> 1: percolake faster)",
        ),
        summarize(
            "spark.e2e.vs_iceberg.ratio",
            "x",
            E2E_ICEBERG,
            [t / o for t, o in zip(seconds[ICEBERG], ours, strict=True)],
            e2e_note + "; iceberg time / percolake time of paired runs (> 1: percolake faster)",
        ),
        Latency.of(
            "spark.commit.latency",
            "The commit part of a Spark append (after the Spark write)",
            "ms",
            commit_ms,
            note=f"{size}; percolake: spark.commit_hook.fixed_ms (lh.append minus its Spark "
            "write, so it includes the prepare before the write); deltalake: listing the part "
            "files, their footers and create_write_transaction; iceberg: listing the part "
            "files and add_files (which reads their footers)",
        ),
    ]


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    return [
        *bench_appends(quick, progress),
        *bench_listing(quick, progress),
        *bench_snapshot_reads(quick, progress),
        *bench_spark(quick, progress),
    ]


def main() -> None:
    from bench.__main__ import describe

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    for result in run(args.quick, progress=lambda n: print("running", n, flush=True)):
        print(describe(result))
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
