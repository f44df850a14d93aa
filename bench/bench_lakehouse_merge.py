"""MERGE through ``percolake serve`` against delta-rs's MERGE, same data, same machine.

Deployed topology: one ``percolake serve`` process (oracle, lock server and gateway) on
SQLite in a temporary folder on local disk; the Lakehouse runs over
``TransactionManager.remote(gateway)``. Two figures:

* ``lakehouse.merge.rows10m.vs_deltalake.ratio``: an *unpartitioned* table of 10
  million rows in 100 files (quick: 200,000 rows in 10 files), columns ``id bigint,
  k bigint, s string, x double``, written by ``lh.append`` of ``spark.range`` in that
  many partitions; the delta-rs table holds the very same rows (each percolake file
  read with pyarrow and appended by ``write_deltalake``, one file per commit). Each
  MERGE's source is 1% of the table's rows: half updates of existing keys spread over
  every file, half inserts of new keys; ``ON target.id = source.id``, update all,
  insert all. Ours: ``lh.merge(...).execute()`` in one local[2] session; theirs:
  ``DeltaTable.merge(...).execute()`` with the source as an Arrow table. Each run uses
  keys no earlier run used (the table grows 0.5% a run), the order of the two systems
  rotated per run, after one warm-up merge of each. Value: delta-rs time / ours of
  paired runs (above 1: we are faster). Rows are counted on both sides at the end.
* ``lakehouse.merge.concurrent_disjoint.failed``: a table partitioned by ``p`` (two
  values); two writer *processes* (spawned, each with its own local[1] Spark session and
  remote manager, to fit two cores) each run 50 MERGEs (quick: 5) into their own
  partition at the same time, ``ON target.p = <i> AND target.p = source.p AND
  target.id = source.id``. Value: our failed statements; the same workload with
  delta-rs (two processes, default conflict handling, no retries) gives the anchor's
  failed count, in the note and in ``lakehouse.merge.concurrent_disjoint.deltalake_failed``.

delta-spark is not an anchor: no Delta Lake release is built for this PySpark (see
docs/benchmarks.md).

``python -m bench --only bench.bench_lakehouse_merge [--quick]`` runs this suite alone
and merges its figures into ``bench/results`` (``quick/`` with ``--quick``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._lakehouse_anchors import version_of
from bench._load import end_processes, receive, start_processes
from bench._results import Figure, MachineLoad, Result, summarize

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from spark_integration import Lakehouse

log = logging.getLogger(__name__)

PERCOLAKE, DELTA = "percolake", "deltalake"
RATIO_TABLE = "merge_rows"
CONCURRENT_TABLE = "merge_disjoint"
WRITERS = 2
#: A writer's start (spawn, Spark session, table opened) and its whole run are bounded.
READY_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 900.0
DELTA_RS = f"delta-rs {version_of('deltalake')}"
TOPOLOGY = (
    "2-core machine; one `percolake serve` (oracle, locks, gateway) on SQLite, the "
    "Lakehouse over TransactionManager.remote; local disk"
)
COLUMNS = ("id", "k", "s", "x")


@dataclass(frozen=True, slots=True)
class Size:
    rows: int
    files: int
    runs: int
    merges: int  # per writer, concurrent phase
    concurrent_rows: int  # rows of the partitioned table
    concurrent_source: int  # source rows of one concurrent MERGE


FULL = Size(10_000_000, 100, 3, 50, 200_000, 200)
QUICK = Size(200_000, 10, 2, 5, 20_000, 100)


def _columns(id_expr: str) -> list[str]:
    """The table's columns computed from a Spark ``id``: deterministic, so a source
    evaluated more than once gives the same rows each time."""
    return [
        f"CAST({id_expr} AS BIGINT) AS id",
        f"CAST(({id_expr}) % 97 AS BIGINT) AS k",
        f"CAST(({id_expr}) * 7 AS STRING) AS s",
        f"CAST({id_expr} AS DOUBLE) * 0.5 AS x",
    ]


def _arrow(ids: Any, p: Any = None) -> pa.Table:
    """The same rows as :func:`_columns` for the numpy array ``ids`` (``p`` added)."""
    import numpy as np
    import pyarrow as pa

    ids = np.asarray(ids, dtype=np.int64)
    cols: dict[str, Any] = {
        "id": pa.array(ids),
        "k": pa.array(ids % 97),
        "s": pa.array(ids * 7).cast(pa.string()),
        "x": pa.array(ids.astype(np.float64) * 0.5),
    }
    if p is not None:
        cols["p"] = pa.array(np.asarray(p, dtype=np.int64))
    return pa.table(cols)


def _source_ids(size: Size, run: int) -> Any:
    """Run ``run``'s MERGE keys: half existing (every ``step``-th id, offset by the run,
    so every file holds some), half new (after every earlier run's inserts)."""
    import numpy as np

    half = size.rows // 200
    step = size.rows // half
    updates = np.arange(half, dtype=np.int64) * step + run
    inserts = size.rows + run * half + np.arange(half, dtype=np.int64)
    return np.concatenate([updates, inserts])


def _source_df(spark: SparkSession, size: Size, run: int) -> DataFrame:
    half = size.rows // 200
    step = size.rows // half
    key = (
        f"(CASE WHEN id < {half} THEN id * {step} + {run} "
        f"ELSE {size.rows + run * half} + (id - {half}) END)"
    )
    return spark.range(0, 2 * half, 1, 2).selectExpr(*_columns(key))


# --- the ratio -------------------------------------------------------------------------


def _delta_copy(lh: Lakehouse, table: str, path: str, partition_by: list[str] | None) -> None:
    """A delta-rs table of the very rows (and files' rows) of percolake's ``table``;
    its partition columns are integers (the only kind this suite partitions by)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    for f in lh.files(table):
        data = pq.read_table(f.path)
        for column, value in f.partition.items():  # partition values live in the path
            data = data.append_column(column, pa.array([int(value or 0)] * data.num_rows))
        write_deltalake(path, data, mode="append", partition_by=partition_by)


def _ratio(
    spark: SparkSession, lh: Lakehouse, root: Path, size: Size, progress: Callable[[str], None]
) -> list[Result]:
    from deltalake import DeltaTable

    progress("merge.setup")
    df = spark.range(0, size.rows, 1, size.files).selectExpr(*_columns("id"))
    lh.create_table(RATIO_TABLE, df.schema)
    lh.append(RATIO_TABLE, df)
    files = len(lh.files(RATIO_TABLE))
    delta_path = str(root / "delta_rows")
    _delta_copy(lh, RATIO_TABLE, delta_path, None)
    delta_files = len(DeltaTable(delta_path).file_uris())
    predicate = "target.id = source.id"

    def ours(run: int) -> float:
        source = _source_df(spark, size, run)
        started = time.perf_counter()
        result = (
            lh.merge(RATIO_TABLE, source, predicate)
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        took = time.perf_counter() - started
        half = size.rows // 200
        assert (result.rows_updated, result.rows_inserted) == (half, half), result
        return took

    def theirs(run: int) -> float:
        source = _arrow(_source_ids(size, run))
        table = DeltaTable(delta_path)
        started = time.perf_counter()
        metrics = (
            table.merge(source, predicate, source_alias="source", target_alias="target")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        took = time.perf_counter() - started
        half = size.rows // 200
        got = (metrics["num_target_rows_updated"], metrics["num_target_rows_inserted"])
        assert got == (half, half), metrics
        return took

    from spark_integration.spark.testing import merge_paths

    jobs: dict[str, Callable[[int], float]] = {PERCOLAKE: ours, DELTA: theirs}
    load = MachineLoad()
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    # Records which path each of our MERGEs took (Arrow or Spark), for the note.
    with merge_paths(spark_only=False) as paths:
        progress("merge.warmup")
        for job in jobs.values():
            job(0)
        for n in range(size.runs):
            progress(f"merge.run{n + 1}")
            order = list(jobs)[n % 2 :] + list(jobs)[: n % 2]
            for name in order:
                seconds[name].append(jobs[name](n + 1))
    want = size.rows + (size.runs + 1) * (size.rows // 200)
    ours_rows = sum(f.record_count for f in lh.files(RATIO_TABLE))
    theirs_rows = DeltaTable(delta_path).to_pyarrow_dataset().count_rows()
    assert ours_rows == theirs_rows == want, (ours_rows, theirs_rows, want)
    label = "rows10m" if size.rows == FULL.rows else f"rows{size.rows}"
    what = (
        f"{TOPOLOGY}; unpartitioned table of {size.rows:,} rows in {files} files "
        f"(delta-rs: the same rows, {delta_files} files); MERGE of 1% of rows "
        f"({size.rows // 200:,} updates of existing keys spread over every file + "
        f"{size.rows // 200:,} inserts), ON target.id = source.id, update all / insert "
        f"all; ours: lh.merge in one local[2] session ({paths.count('arrow')} of {len(paths)} "
        f"MERGEs in Arrow, spark/merge_arrow.py); {size.runs} runs after one warm-up "
        f"of each, order rotated per run; {load.note()}"
    )
    anchor = f"{DELTA_RS} DeltaTable.merge of the same rows and source, same run"
    return [
        summarize(
            f"lakehouse.merge.{label}.vs_deltalake.ratio",
            "x",
            anchor,
            [d / o for d, o in zip(seconds[DELTA], seconds[PERCOLAKE], strict=True)],
            what + "; delta-rs seconds / ours of paired runs (above 1: we are faster)",
        ),
        summarize(f"lakehouse.merge.{label}.seconds", "s", anchor, seconds[PERCOLAKE], what),
        summarize(f"lakehouse.merge.{label}.deltalake_seconds", "s", anchor, seconds[DELTA], what),
    ]


# --- the concurrent writers ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    """What one writer process runs."""

    system: str
    index: int
    merges: int
    rows: int  # the table's rows before any MERGE (even)
    source_rows: int
    gateway: str = ""
    warehouse: str = ""
    delta_path: str = ""


@dataclass(slots=True)
class WriterRun:
    done: int = 0
    failed: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def _writer_ids(spec: Spec, j: int) -> tuple[Any, Any]:
    """MERGE ``j`` of writer ``i``: half updates of existing ids of partition ``i``
    (``id % 2 == i``), half new ids of partition ``i``, none used by another MERGE."""
    import numpy as np

    half = spec.source_rows // 2
    t = np.arange(half, dtype=np.int64) + j * half
    ids = np.concatenate([spec.index + 2 * t, spec.rows + spec.index + 2 * t])
    return ids, np.full(len(ids), spec.index, dtype=np.int64)


def _predicate(index: int) -> str:
    return f"target.p = {index} AND target.p = source.p AND target.id = source.id"


def writer_main(conn: Connection, spec: Spec) -> None:
    """A writer process: open its handles, say hello, wait for ``go``, run
    ``spec.merges`` MERGEs (a statement that raises is failed, never retried), report."""
    logging.basicConfig(level=logging.WARNING)
    run = WriterRun()
    try:
        merge_once, close = _open(spec)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    try:
        conn.send(("hello", os.getpid()))
        if conn.recv() is None:
            return
        started = time.perf_counter()
        for j in range(spec.merges):
            try:
                merge_once(j)
                run.done += 1
            except Exception as e:
                run.failed += 1
                if len(run.errors) < 3:
                    run.errors.append(f"{type(e).__name__}: {e}"[:300])
        run.seconds = time.perf_counter() - started
        conn.send(("done", run))
    finally:
        close()


def _open(spec: Spec) -> tuple[Callable[[int], None], Callable[[], None]]:
    if spec.system == DELTA:
        from deltalake import DeltaTable

        DeltaTable(spec.delta_path)  # the table loads: the handle is open

        def delta_merge(j: int) -> None:
            ids, p = _writer_ids(spec, j)
            table = DeltaTable(spec.delta_path)
            (
                table.merge(
                    _arrow(ids, p),
                    _predicate(spec.index),
                    source_alias="source",
                    target_alias="target",
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )

        return delta_merge, lambda: None

    from spark_integration import Lakehouse
    from spark_integration.spark.session import local_session
    from txn import TransactionManager

    spark = local_session(
        f"percolake-bench-merge-w{spec.index}",
        **{"spark.master": "local[1]", "spark.driver.memory": "1g"},
    )
    tm = TransactionManager.remote(spec.gateway)
    lh = Lakehouse(tm, spec.warehouse)
    lh.version(CONCURRENT_TABLE)

    def our_merge(j: int) -> None:
        ids, p = _writer_ids(spec, j)
        source = spark.createDataFrame(_arrow(ids, p).to_pandas()).localCheckpoint()
        (
            lh.merge(CONCURRENT_TABLE, source, _predicate(spec.index))
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def close() -> None:
        tm.close()
        spark.stop()

    return our_merge, close


def _writers(specs: list[Spec]) -> list[WriterRun]:
    """Run ``specs`` as processes released together; each bounded in time."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    conns: list[Connection] = []
    try:
        for spec in specs:
            p, c = start_processes(
                ctx, writer_main, (spec,), 1, f"merge-{spec.system}-{spec.index}", READY_TIMEOUT_S
            )
            procs += p
            conns += c
        for conn in conns:
            conn.send("go")
        runs = []
        for proc, conn in zip(procs, conns, strict=True):
            kind, payload = receive(proc, conn, RUN_TIMEOUT_S)
            if kind != "done":
                raise RuntimeError(f"{proc.name}: {kind}: {payload}")
            runs.append(payload)
        return runs
    finally:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        end_processes(procs, conns)


def _concurrent(
    spark: SparkSession,
    lh: Lakehouse,
    gateway: str,
    warehouse: Path,
    root: Path,
    size: Size,
    progress: Callable[[str], None],
) -> Callable[[], list[Result]]:
    """Create both tables now (the parent's session); the returned run starts the
    writers once the parent's session has stopped (two cores, two writer JVMs)."""
    progress("merge.concurrent.setup")
    df = spark.range(0, size.concurrent_rows, 1, 2).selectExpr(*_columns("id"), "id % 2 AS p")
    lh.create_table(CONCURRENT_TABLE, df.schema, partition_by="p")
    lh.append(CONCURRENT_TABLE, df)
    delta_path = str(root / "delta_disjoint")
    _delta_copy(lh, CONCURRENT_TABLE, delta_path, ["p"])

    def specs(system: str) -> list[Spec]:
        return [
            Spec(
                system,
                i,
                size.merges,
                size.concurrent_rows,
                size.concurrent_source,
                gateway,
                str(warehouse),
                delta_path,
            )
            for i in range(WRITERS)
        ]

    def run() -> list[Result]:
        progress("merge.concurrent.percolake")
        ours = _writers(specs(PERCOLAKE))
        progress("merge.concurrent.deltalake")
        theirs = _writers(specs(DELTA))
        return _concurrent_results(lh, ours, theirs, size, delta_path)

    return run


def _concurrent_results(
    lh: Lakehouse, ours: list[WriterRun], theirs: list[WriterRun], size: Size, delta_path: str
) -> list[Result]:
    from deltalake import DeltaTable

    our_failed = sum(r.failed for r in ours)
    their_failed = sum(r.failed for r in theirs)
    inserted = size.concurrent_source // 2
    want = size.concurrent_rows + sum(r.done for r in ours) * inserted
    got = sum(f.record_count for f in lh.files(CONCURRENT_TABLE))
    assert got == want, (got, want)
    want_delta = size.concurrent_rows + sum(r.done for r in theirs) * inserted
    got_delta = DeltaTable(delta_path).to_pyarrow_dataset().count_rows()
    assert got_delta == want_delta, (got_delta, want_delta)
    for system, runs in ((PERCOLAKE, ours), (DELTA, theirs)):
        for r in runs:
            if r.errors:
                log.warning("%s writer errors: %s", system, r.errors)
    total = WRITERS * size.merges
    what = (
        f"{TOPOLOGY}; table of {size.concurrent_rows:,} rows partitioned by p (2 values); "
        f"{WRITERS} writer processes (spawned, each its own local[1] Spark session and "
        f"remote manager) each running {size.merges} MERGEs of {size.concurrent_source} "
        "source rows (half updates, half inserts) into its own partition at the same "
        f"time, no retries; ours failed {our_failed} of {total} "
        f"(seconds per writer {[round(r.seconds, 1) for r in ours]}); {DELTA_RS}, the "
        f"same workload from two processes, default conflict handling: failed "
        f"{their_failed} of {total}"
        + (
            f" (first error: {theirs[0].errors[0] if theirs[0].errors else theirs[1].errors[0]})"
            if their_failed
            else ""
        )
    )
    anchor = f"{DELTA_RS} DeltaTable.merge, same workload, same run: {their_failed} failed"
    return [
        Figure(
            "lakehouse.merge.concurrent_disjoint.failed",
            our_failed,
            "statements",
            1,
            0.0,
            anchor,
            what,
        ),
        Figure(
            "lakehouse.merge.concurrent_disjoint.deltalake_failed",
            their_failed,
            "statements",
            1,
            0.0,
            anchor,
            what,
        ),
    ]


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    from spark_integration import Lakehouse
    from spark_integration.spark.session import local_session
    from tests.servers import ServerProcess
    from txn import TransactionManager

    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        warehouse = root / "warehouse"
        server = ServerProcess("all", ["--store", f"sqlite:///{tmp}/store.db"], root).start()
        tm = TransactionManager.remote(server.address)
        spark = local_session("percolake-bench-merge", **{"spark.driver.memory": "3g"})
        stopped = False
        try:
            lh = Lakehouse(tm, warehouse)
            results = _ratio(spark, lh, root, size, progress)
            concurrent = _concurrent(spark, lh, server.address, warehouse, root, size, progress)
            spark.stop()
            stopped = True
            results += concurrent()
        finally:
            if not stopped:
                spark.stop()
            tm.close()
            server.stop()
    return results
