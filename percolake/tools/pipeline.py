"""The main job behind ``make run``: PySpark writers committing through the gateway.

Starts ``percolake serve`` on the embedded SQLite store, then runs a small pipeline
against it with a local Spark session: two writers appending concurrently, a job
that crashes half-way and leaves the table untouched, an idempotent replay, a
batch write and a streaming query through ``format("percolake")``, time-travel reads
(by version and by timestamp), a commit to two tables in one transaction, and a
vacuum, and prints what it saw at each step.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TABLE = "events"
SCHEMA = "id BIGINT, writer STRING, amount DOUBLE"
AUDIT = "audit"
AUDIT_SCHEMA = "job STRING, row_count BIGINT"
READY_TIMEOUT_S = 60.0
STREAM_TIMEOUT_S = 300


@contextlib.contextmanager
def served_gateway(workdir: Path) -> Iterator[str]:
    """A ``percolake serve`` process on the embedded store; yields its address."""
    ready = workdir / "serve.ready"
    ready.unlink(missing_ok=True)
    store = f"sqlite:///{workdir / 'store.db'}"
    log = (workdir / "serve.log").open("ab")
    command = [
        sys.executable,
        "-m",
        "percolake",
        "serve",
        "--store",
        store,
        "--listen",
        "127.0.0.1:0",
        "--ready-file",
        str(ready),
    ]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (ready.exists() and ready.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"percolake serve did not start; see {workdir / 'serve.log'}")
            time.sleep(0.05)
        yield f"127.0.0.1:{int(ready.read_text())}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _batch(spark: SparkSession, writer: str, start: int, rows: int) -> DataFrame:
    return spark.createDataFrame([(start + i, writer, float(i % 97)) for i in range(rows)], SCHEMA)


def _explode_half_way(value: int) -> int:
    if value >= 500:
        raise RuntimeError("simulated executor crash half-way through the job")
    return value


def _cause(exc: BaseException) -> str:
    """The line of a failed Spark job that says why: the task's own error if it shows."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("RuntimeError:"):
            return line
    return f"{type(exc).__name__}: {lines[0][:100] if lines else ''}"


def _through_the_data_source(spark: SparkSession, gateway: str, workdir: Path) -> int:
    """A batch write and a bounded streaming query, both ``format("percolake")``."""
    from spark_integration import register

    register(spark)
    _batch(spark, "source-batch", 70_000, 200).write.format("percolake").mode("append").option(
        "gateway", gateway
    ).save(TABLE)
    incoming = workdir / "stream-in"
    incoming.mkdir()
    for part in range(3):
        rows = [
            {"id": 80_000 + part * 100 + i, "writer": "stream", "amount": float(i)}
            for i in range(100)
        ]
        (incoming / f"part-{part}.json").write_text("\n".join(json.dumps(r) for r in rows))
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(incoming))
    query = (
        stream.writeStream.format("percolake")
        .option("gateway", gateway)
        .option("checkpointLocation", str(workdir / "stream-checkpoint"))
        .trigger(availableNow=True)
        .start(TABLE)
    )
    try:
        if not query.awaitTermination(STREAM_TIMEOUT_S):
            raise RuntimeError(f"the streaming query did not finish in {STREAM_TIMEOUT_S} s")
    finally:
        query.stop()
    return 500


def run_pipeline(workdir: Path, out: TextIO) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from spark_integration import Lakehouse
    from spark_integration.spark.session import local_session
    from txn import TransactionManager

    def say(line: str = "") -> None:
        out.write(line + "\n")
        out.flush()

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    warehouse = workdir / "warehouse"
    started = time.monotonic()
    with served_gateway(workdir) as address:
        say(f"percolake serve is up on {address} (store sqlite:///{workdir / 'store.db'})")
        spark = local_session("percolake-demo", **{"spark.task.maxFailures": "1"})
        tm = TransactionManager.remote(address)
        try:
            lh = Lakehouse(tm, warehouse=str(warehouse))
            lh.create_table(TABLE, SCHEMA)
            say(f"created table {TABLE!r} ({SCHEMA}) at version 0")

            versions: dict[str, int] = {}

            def writer(name: str, start: int) -> None:
                versions[name] = lh.append(TABLE, _batch(spark, name, start, 1000))

            threads = [
                threading.Thread(target=writer, args=("writer-a", 0)),
                threading.Thread(target=writer, args=("writer-b", 10_000)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            say(
                "two writers appended 1000 rows each, concurrently, through gRPC: "
                f"versions {sorted(versions.values())}, no failed commit"
            )

            rows_source = _through_the_data_source(spark, address, workdir)
            say(
                "format('percolake'): a batch write and a streaming query (3 micro-batches, "
                f"each committed exactly once) appended {rows_source} rows to the same table: "
                f"now version {lh.version(TABLE)}, {lh.read(spark, TABLE).count()} rows"
            )

            before = lh.version(TABLE)
            crash = F.udf(_explode_half_way, LongType(), useArrow=False)
            doomed = _batch(spark, "doomed", 20_000, 1000).withColumn(
                "id", crash(F.col("id") - 20_000)
            )
            # Spark logs every failed task attempt with its stack trace; the one line
            # below says what failed, so quiet Spark for this step only.
            spark.sparkContext.setLogLevel("OFF")
            try:
                lh.append(TABLE, doomed)
                say("the crashing job unexpectedly succeeded")
                return 1
            except Exception as exc:
                say(f"a job crashed half-way: {_cause(exc)}")
            finally:
                spark.sparkContext.setLogLevel("WARN")
            rows_now = lh.read(spark, TABLE).count()
            say(
                f"  the table is untouched: still version {lh.version(TABLE)} "
                f"(was {before}), {rows_now} rows"
            )

            first_replay = lh.append(TABLE, _batch(spark, "nightly", 30_000, 500), "nightly", 7)
            replay = lh.append(TABLE, _batch(spark, "nightly", 30_000, 500), "nightly", 7)
            say(
                f"batch (nightly, 7) committed as version {first_replay}; its replay returned "
                f"version {replay} and added nothing ({lh.read(spark, TABLE).count()} rows)"
            )

            before_overwrite = time.time_ns() // 1_000_000
            time.sleep(0.01)  # the overwrite commits at a later millisecond
            overwritten = lh.overwrite(TABLE, _batch(spark, "rewrite", 40_000, 300))
            say(f"an overwrite replaced every file as version {overwritten}")
            as_of = lh.read(spark, TABLE, timestamp=before_overwrite).count()
            say(f"  read as of just before it (time travel by timestamp): {as_of} rows")

            lh.create_table(AUDIT, AUDIT_SCHEMA)
            with lh.transaction() as multi:
                multi.append(TABLE, _batch(spark, "txn", 50_000, 100))
                multi.append(AUDIT, spark.createDataFrame([("txn", 100)], AUDIT_SCHEMA))
            say(
                f"one transaction appended to {TABLE!r} and {AUDIT!r} together: versions "
                f"{multi.versions[TABLE]} and {multi.versions[AUDIT]}"
            )
            try:
                with lh.transaction() as failing:
                    failing.append(TABLE, _batch(spark, "txn", 60_000, 100))
                    raise RuntimeError("the job failed before its second table")
            except RuntimeError:
                say(
                    f"  a second one failed half-way and committed nothing: {TABLE!r} is "
                    f"still at version {lh.version(TABLE)}"
                )

            say("rows at each version (time travel):")
            for commit in lh.history(TABLE):
                count = lh.read(spark, TABLE, version=commit.version).count()
                say(
                    f"  v{commit.version:<2} {commit.operation:<12} +{len(commit.added_files)} "
                    f"-{len(commit.removed_files)} files  {count:>5} rows"
                )
            removed = lh.vacuum(TABLE, retain_seconds=0)
            kept = lh.read(spark, TABLE).count()
            expected_kept = 400  # the overwrite's 300 rows and the transaction's 100
            say(
                f"vacuum removed {len(removed)} unreferenced files (the crashed job's and the "
                f"overwritten ones); the latest version still reads {kept} rows"
            )
            say(f"done in {time.monotonic() - started:.1f}s")
            ok = rows_now == 2500 and replay == first_replay and kept == expected_kept
            return 0 if ok and as_of == 3000 else 1
        finally:
            tm.close()
            spark.stop()


def default_workdir() -> Path:
    return Path(
        os.environ.get("PERCOLAKE_DEMO_DIR", Path(tempfile.gettempdir()) / "percolake-demo")
    )
