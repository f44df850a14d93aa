"""Lakehouse tables against Delta Lake (delta-rs), side by side on this machine.

* Metadata-only appends to one table, 1 and 8 concurrent writers: percolake's
  ``Lakehouse.append_files`` (embedded manager on SQLite) against delta-rs's
  ``create_write_transaction`` with one ``AddAction``, both on local disk.
* Listing the live files after 10, 1,000 and 100,000 one-file commits, each from a
  cold start: a fresh manager on the store against a fresh ``DeltaTable`` (quick
  mode stops at 10,000). percolake's commits are real ``append_files`` calls.
  Delta's log is written in the exact JSON delta-rs wrote for its own first append
  (paths and times changed) and checkpointed by delta-rs where its default
  ``checkpointInterval`` of 100 would: real delta-rs commits run at ~50/s, so
  100,000 of them would take over half an hour for a state that reads the same.
* The Spark commit hook: ``lh.append`` of a DataFrame against a plain
  ``df.write.parquet`` of the same DataFrame, same local[2] session.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench._results import Figure, measure
from spark_integration import DataFile, Lakehouse
from spark_integration import failpoints as fp
from spark_integration._session import local_session
from txn import TransactionManager

TABLE = "events"

APPEND_ANCHOR = (
    "Delta Lake (delta-rs create_write_transaction, one AddAction per commit, local disk, "
    "same run); DESIGN.md: about 60-70 metadata-only commits/s, one writer or eight"
)
LIST_ANCHOR = (
    "Delta Lake (delta-rs DeltaTable(path).file_uris() from a cold start, same run, log "
    "checkpointed every 100 commits as delta-rs does by default)"
)
SPARK_ANCHOR = "plain df.write.parquet of the same DataFrame, same local[2] session, same run"


def _schema() -> Any:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("id", LongType())])


def _figure(name: str, unit: str, anchor: str, values: list[float], note: str = "") -> Figure:
    it = iter(values)
    return measure(name, unit, anchor, len(values), lambda: next(it), note)


def _rate(commit: Callable[[int], None], threads: int, seconds: float) -> tuple[float, int]:
    """Successful commits per second, and how many commits raised."""
    counter = itertools.count()
    done = [0] * threads
    failed = [0] * threads
    stop = time.monotonic() + seconds

    def worker(slot: int) -> None:
        while time.monotonic() < stop:
            try:
                commit(next(counter))
            except Exception:
                failed[slot] += 1
                continue
            done[slot] += 1

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(done) / (time.monotonic() - started), sum(failed)


# --- percolake side --------------------------------------------------------------------


class _Percolake:
    """A fresh store, warehouse and one-column table in ``root``."""

    def __init__(self, root: Path) -> None:
        self.url = f"sqlite:///{root}/store.db"
        self.warehouse = root / "warehouse"
        self.tm = TransactionManager.embedded(self.url)
        self.lh = Lakehouse(self.tm, self.warehouse)
        self.lh.create_table(TABLE, _schema())
        self.folder = f"{self.warehouse}/{TABLE}/_lh_job=bench"

    def append(self, n: int) -> None:
        path = f"{self.folder}/part-{n:08d}.parquet"
        self.lh.append_files(TABLE, [DataFile(path, 1000, 10)])

    def list_cold(self) -> tuple[float, int]:
        started = time.perf_counter()
        with TransactionManager.embedded(self.url) as tm:
            count = len(Lakehouse(tm, self.warehouse).files(TABLE))
            return time.perf_counter() - started, count

    def list_warm(self) -> tuple[float, int]:
        started = time.perf_counter()
        count = len(self.lh.files(TABLE))
        return time.perf_counter() - started, count

    def close(self) -> None:
        self.tm.close()


# --- delta side ------------------------------------------------------------------------


class _Delta:
    """A delta-rs table with the same one-column schema in ``root``."""

    def __init__(self, root: Path) -> None:
        import pyarrow as pa
        from deltalake import Schema
        from deltalake.transaction import create_table_with_add_actions

        self.path = str(root / "delta")
        self.schema = Schema.from_arrow(pa.schema([("id", pa.int64())]))
        create_table_with_add_actions(self.path, self.schema, [], mode="error")
        self._local = threading.local()

    def _table(self) -> Any:
        from deltalake import DeltaTable

        table = getattr(self._local, "table", None)
        if table is None:
            table = self._local.table = DeltaTable(self.path)
        return table

    def append(self, n: int) -> None:
        from deltalake.transaction import AddAction

        action = AddAction(
            f"part-{n:08d}.parquet", 1000, {}, time.time_ns() // 10**6, True, '{"numRecords":10}'
        )
        self._table().create_write_transaction([action], mode="append", schema=self.schema)

    def synthesize(self, commits: int) -> None:
        """Versions 2..``commits`` in the JSON delta-rs wrote for version 1, checkpointed
        where delta-rs's default interval would leave the latest checkpoint."""
        from deltalake import DeltaTable

        self.append(1)
        log_dir = Path(self.path) / "_delta_log"
        template = [
            json.loads(line) for line in (log_dir / f"{1:020d}.json").read_text().splitlines()
        ]
        checkpoint_at = ((commits + 1) // 100) * 100 - 1  # delta-rs: after versions 99, 199, ...

        def write(version: int) -> None:
            now = time.time_ns() // 10**6
            lines = []
            for original in template:
                action = json.loads(json.dumps(original))
                if "commitInfo" in action:
                    action["commitInfo"]["timestamp"] = now
                if "add" in action:
                    action["add"]["path"] = f"part-{version:08d}.parquet"
                    action["add"]["modificationTime"] = now
                lines.append(json.dumps(action, separators=(",", ":")))
            with open(log_dir / f"{version:020d}.json", "x") as out:
                out.write("\n".join(lines) + "\n")

        for version in range(2, commits + 1):
            write(version)
            if version == checkpoint_at:
                DeltaTable(self.path).create_checkpoint()
        table = DeltaTable(self.path)
        assert table.version() == commits, (table.version(), commits)

    def list_cold(self) -> tuple[float, int]:
        from deltalake import DeltaTable

        started = time.perf_counter()
        count = len(DeltaTable(self.path).file_uris())
        return time.perf_counter() - started, count


# --- the benchmarks --------------------------------------------------------------------


def bench_appends(quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    seconds = 2.0 if quick else 5.0
    runs = 2 if quick else 3
    figures = []
    for writers in (1, 8):
        progress(f"lakehouse.appends.writers{writers}")
        ours: list[float] = []
        theirs: list[float] = []
        failures = [0, 0]
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                pl = _Percolake(Path(tmp))
                try:
                    rate, failed = _rate(pl.append, writers, seconds)
                finally:
                    pl.close()
                ours.append(rate)
                failures[0] += failed
                delta = _Delta(Path(tmp))
                rate, failed = _rate(delta.append, writers, seconds)
                theirs.append(rate)
                failures[1] += failed
        note = (
            f"{seconds:.0f} s per run, one-file metadata-only commits to one table; "
            f"failed commits: percolake {failures[0]}, deltalake {failures[1]}"
        )
        figures += [
            _figure(
                f"lakehouse.appends.writers{writers}.commits_per_s",
                "commits/s",
                APPEND_ANCHOR,
                ours,
                note,
            ),
            _figure(
                f"deltalake.appends.writers{writers}.commits_per_s",
                "commits/s",
                APPEND_ANCHOR,
                theirs,
                note,
            ),
            _figure(
                f"lakehouse.appends.writers{writers}.vs_deltalake.ratio",
                "x",
                APPEND_ANCHOR,
                [a / b for a, b in zip(ours, theirs, strict=True)],
                note + "; ratio of paired runs",
            ),
        ]
    return figures


def bench_listing(quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    counts = (10, 1_000, 10_000) if quick else (10, 1_000, 100_000)
    runs = 3 if quick else 5
    figures = []
    for commits in counts:
        progress(f"lakehouse.list_files.commits{commits}")
        with tempfile.TemporaryDirectory() as tmp:
            pl = _Percolake(Path(tmp))
            try:
                started = time.monotonic()
                for n in range(commits):
                    pl.append(n)
                setup_s = time.monotonic() - started
                cold = [pl.list_cold() for _ in range(runs)]
                warm = [pl.list_warm() for _ in range(runs)]
            finally:
                pl.close()
            delta = _Delta(Path(tmp))
            delta.synthesize(commits)
            theirs = [delta.list_cold() for _ in range(runs)]
        assert {n for _, n in cold + warm + theirs} == {commits}
        ours_ms = [s * 1000 for s, _ in cold]
        theirs_ms = [s * 1000 for s, _ in theirs]
        note = (
            f"{commits} one-file commits; percolake made them in {setup_s:.1f} s "
            f"({commits / setup_s:.0f} commits/s); cold = fresh manager / fresh DeltaTable"
        )
        if quick and commits == counts[-1]:
            note += "; quick mode: 10,000 commits instead of 100,000"
        figures += [
            _figure(f"lakehouse.list_files.commits{commits}.ms", "ms", LIST_ANCHOR, ours_ms, note),
            _figure(
                f"lakehouse.list_files.commits{commits}.warm.ms",
                "ms",
                LIST_ANCHOR,
                [s * 1000 for s, _ in warm],
                note + "; warm = the manager that made the commits (status cache filled)",
            ),
            _figure(
                f"deltalake.list_files.commits{commits}.ms", "ms", LIST_ANCHOR, theirs_ms, note
            ),
            _figure(
                f"lakehouse.list_files.commits{commits}.vs_deltalake.ratio",
                "x",
                LIST_ANCHOR,
                [statistics.median(theirs_ms) / statistics.median(ours_ms)],
                note + f"; deltalake median time / percolake median time, {runs} runs each",
            ),
        ]
    return figures


def bench_commit_hook(quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    # Large enough that one write takes seconds: the hook's fixed cost (three small
    # transactions and the footer reads) is then measured against a real job, and
    # a busy machine's noise averages out over the pairs.
    rows = 1_000_000 if quick else 8_000_000
    runs = 3 if quick else 7
    progress("spark.commit_hook.overhead")
    spark = local_session("percolake-bench", **{"spark.driver.memory": "2g"})
    try:
        df = spark.range(0, rows, 1, 4).selectExpr(
            "id", "id % 97 AS k", "CAST(id * 7 AS STRING) AS s", "rand(1) AS x"
        )
        with tempfile.TemporaryDirectory() as tmp:
            tm = TransactionManager.embedded(f"sqlite:///{tmp}/store.db")
            try:
                lh = Lakehouse(tm, f"{tmp}/warehouse")
                lh.create_table(TABLE, df.schema)
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
                fixed_ms: list[float] = []

                def hooked() -> float:
                    started = time.perf_counter()
                    lh.append(TABLE, df)
                    took = time.perf_counter() - started
                    fixed_ms.append((took - write_s[-1]) * 1000)
                    return took

                plain(), hooked()  # warm up the JVM and the Python workers
                pairs = []
                for n in range(runs):
                    # Alternate which goes first, so neither always gets a warmer cache.
                    if n % 2:
                        h = hooked()
                        pairs.append((plain(), h))
                    else:
                        p = plain()
                        pairs.append((p, hooked()))
            finally:
                tm.close()
    finally:
        spark.stop()
    note = f"{rows:,} rows x 4 columns, 4 files per write, local[2]; ratio of paired runs"
    fixed_note = (
        "lh.append wall time minus its Spark write: prepare and commit transactions, "
        "schema check, footer reads, commit_ts record; same runs"
    )
    return [
        _figure(
            "spark.commit_hook.overhead.ratio",
            "x",
            SPARK_ANCHOR,
            [h / p for p, h in pairs],
            note,
        ),
        _figure("spark.df_write_parquet.seconds", "s", SPARK_ANCHOR, [p for p, _ in pairs], note),
        _figure("spark.lakehouse_append.seconds", "s", SPARK_ANCHOR, [h for _, h in pairs], note),
        _figure("spark.commit_hook.fixed_ms", "ms", SPARK_ANCHOR, fixed_ms[1:], fixed_note),
    ]


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Figure]:
    return [
        *bench_appends(quick, progress),
        *bench_listing(quick, progress),
        *bench_commit_hook(quick, progress),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for figure in run(args.quick, progress=lambda n: print("running", n, flush=True)):
        print(
            f"{figure.name:60s} {figure.value:>12.4f} {figure.unit}  (spread {figure.spread:.0%})"
        )


if __name__ == "__main__":
    main()
