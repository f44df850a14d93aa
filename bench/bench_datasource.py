"""The ``percolake`` Spark data source's write path against Spark's own Parquet writer.

One local[2] session, one DataFrame (``spark.range`` with four columns in four
partitions), one real ``percolake serve`` gateway (SQLite store) in a temporary
folder. Three writes of the same DataFrame, their order rotated per run:

* ``df.write.format("parquet")`` into a fresh folder: the floor, no table at all;
* ``df.write.format("percolake").mode("append").save(table)``: Python workers get
  the rows as Arrow batches and write Parquet with pyarrow, then the driver commits
  the files through the gateway (the Python Data Source API path);
* ``lh.append(table, df)`` on a ``Lakehouse`` over a remote manager to the same
  gateway: Spark's own Parquet writer, then the commit (the native bulk path).

``spark.datasource.write.vs_parquet.ratio`` is the second's time over the first's, of
paired runs: the whole overhead of the Python writer (rows leaving the JVM as Arrow,
pyarrow's encoder, the commit) over the JVM writer. Each table is checked to hold
every row written at the end.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench._results import Result, summarize
from spark_integration import Lakehouse, register
from spark_integration.spark.session import local_session
from txn import TransactionManager

ANCHOR = 'df.write.format("parquet") of the same DataFrame, same local[2] session, same run'
DATASOURCE_TABLE = "ds_events"
NATIVE_TABLE = "native_events"


def _rotated(items: list[str], n: int) -> list[str]:
    k = n % len(items)
    return items[k:] + items[:k]


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    from tests.servers import ServerProcess

    rows = 100_000 if quick else 1_000_000
    runs = 2 if quick else 5
    progress("spark.datasource.write")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server = ServerProcess("all", ["--store", f"sqlite:///{tmp}/store.db"], workdir).start()
        spark = local_session("percolake-bench-datasource", **{"spark.driver.memory": "2g"})
        tm = TransactionManager.remote(server.address)
        try:
            register(spark)
            df = spark.range(0, rows, 1, 4).selectExpr(
                "id", "id % 97 AS k", "CAST(id * 7 AS STRING) AS s", "rand(1) AS x"
            )
            lh = Lakehouse(tm, workdir / "warehouse")
            lh.create_table(DATASOURCE_TABLE, df.schema)
            lh.create_table(NATIVE_TABLE, df.schema)
            plain_dirs: Iterator[str] = (f"{tmp}/plain/{n}" for n in itertools.count())

            def plain() -> float:
                started = time.perf_counter()
                df.write.format("parquet").save(next(plain_dirs))
                return time.perf_counter() - started

            def datasource() -> float:
                started = time.perf_counter()
                df.write.format("percolake").mode("append").option("gateway", server.address).save(
                    DATASOURCE_TABLE
                )
                return time.perf_counter() - started

            def native() -> float:
                started = time.perf_counter()
                lh.append(NATIVE_TABLE, df)
                return time.perf_counter() - started

            jobs: dict[str, Callable[[], float]] = {
                "parquet": plain,
                "datasource": datasource,
                "native": native,
            }
            for job in jobs.values():  # warm up the JVM, the Python workers, each path
                job()
            seconds: dict[str, list[float]] = {name: [] for name in jobs}
            for n in range(runs):
                for name in _rotated(list(jobs), n):
                    seconds[name].append(jobs[name]())
            progress("spark.datasource.verify")
            want = (runs + 1) * rows
            counted = {
                table: sum(f.record_count for f in lh.files(table))
                for table in (DATASOURCE_TABLE, NATIVE_TABLE)
            }
            assert all(c == want for c in counted.values()), (counted, want)
        finally:
            tm.close()
            spark.stop()
            server.stop()
    size = (
        f"{rows:,} rows x 4 columns (bigint, bigint, string, double), 4 partitions, "
        f"local[2]; gateway: percolake serve on SQLite; {runs} runs after one warm-up of "
        "each, order rotated per run"
    )
    pd, pn, pp = seconds["datasource"], seconds["native"], seconds["parquet"]
    return [
        summarize(
            "spark.datasource.write.vs_parquet.ratio",
            "x",
            ANCHOR,
            [d / p for d, p in zip(pd, pp, strict=True)],
            size + '; format("percolake") append time / format("parquet") time of paired '
            "runs (1.0 would be no overhead; the Python writer moves rows JVM -> Arrow -> "
            "pyarrow Parquet, then one commit through the gateway)",
        ),
        summarize(
            "spark.datasource.native.vs_parquet.ratio",
            "x",
            ANCHOR,
            [n / p for n, p in zip(pn, pp, strict=True)],
            size + '; lh.append time / format("parquet") time of paired runs (the native '
            "path: Spark's Parquet writer, then the commit through the gateway)",
        ),
        summarize(
            "spark.datasource.write.vs_native.ratio",
            "x",
            ANCHOR,
            [d / n for d, n in zip(pd, pn, strict=True)],
            size + '; format("percolake") time / lh.append time of paired runs',
        ),
        summarize("spark.datasource.write.seconds", "s", ANCHOR, pd, size),
        summarize("spark.datasource.native_append.seconds", "s", ANCHOR, pn, size),
        summarize("spark.datasource.parquet.seconds", "s", ANCHOR, pp, size),
    ]
