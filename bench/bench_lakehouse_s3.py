"""Tables on S3: appends by concurrent writer processes, and a Spark write, against a
real MinIO started by the benchmark on loopback (its own temporary folder), on the
same machine as everything else.

**Appends** (``lakehouse.s3.appends.writers8.*``): 8 writer processes append
one-file commits to one new, empty table in bucket ``bench`` for a fixed time, in the
topology of ``bench.bench_lakehouse_deployed`` (its writer pool: spawn and import
time excluded, all writers released together, system order rotated per run):

* percolake: each process opens ``TransactionManager.remote(gateway)`` and
  ``Lakehouse(tm, "s3://bench/...")``; per commit it places one 10-row Parquet object
  in its own job folder (one server-side CopyObject of a source object) and calls
  ``append_files`` with it. The gateway is one ``python -m percolake serve`` process
  (oracle, locks, gateway) on SQLite.
* Delta Lake (delta-rs): each process opens its own ``DeltaTable`` on
  ``s3://bench/...`` and commits ``create_write_transaction`` of one ``AddAction``
  (no data object, as in the deployed benchmark). Storage option
  ``conditional_put=etag`` (:data:`DELTA_OPTIONS`): a commit file is written with
  ``If-None-Match``, so a writer that lost the race for a version is refused and
  retries at the next one. Checked before the runs: a stale handle's commit lands at
  the next version and the earlier one is still there.
* Iceberg (pyiceberg ``SqlCatalog`` on SQLite, warehouse ``s3://bench/...``): each
  process loads the table through its own catalog object; per commit it places one
  10-row Parquet object (CopyObject) and calls ``add_files`` (pyiceberg retries a
  conflict itself; a commit that still fails is retried on a reloaded table, up to
  20 times).

After every run the table is read back and must hold exactly the files of the
commits that returned: a lost update fails the benchmark. S3 requests are MinIO's
own count (``minio_api_requests_total`` of its v3 metrics, read anonymously:
``MINIO_PROMETHEUS_AUTH_TYPE=public`` in the server's environment), from just
before the writers open their handles to just after the last commit, over the
successful commits.

**Spark write** (``spark.datasource.s3.write.vs_parquet.ratio``): one local[2]
session with the s3a settings of ``spark_integration.spark.session.s3a_conf``, in a
process of its own started after MinIO (so its JVM has MinIO's variables); the
same DataFrame (``spark.range`` with five columns, one a 64-character hash, in 8
partitions) written by ``df.write.format("percolake")`` to an ``s3://`` table through
a ``percolake serve`` gateway on SQLite, and by ``df.write.parquet`` to a fresh
``s3a://`` folder of the same bucket; paired runs, order rotated.

``python -m bench --only bench.bench_lakehouse_s3`` runs this suite and merges its
figures into ``bench/results/latest.json``; ``python -m bench.bench_lakehouse_s3
[--quick] [--write]`` runs it alone.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench._lakehouse_anchors import ICEBERG_ATTEMPTS, NAMESPACE, version_of
from bench._load import run_child
from bench._results import Figure, MachineLoad, Result, summarize
from bench.bench_lakehouse_deployed import (
    DELTA,
    ICEBERG,
    PERCOLAKE,
    SOURCE_ROWS,
    PercolakeWriter,
    Run,
    Spec,
    WriterPool,
    _paired,
    _rotated,
    gateway,
)

log = logging.getLogger(__name__)

BUCKET = "bench"
WRITERS = 8
#: delta-rs's safe concurrent-writer setting on S3: commit files written with
#: ``If-None-Match: *`` (S3 conditional put, which MinIO supports); no locking provider.
DELTA_OPTIONS = {"conditional_put": "etag", "AWS_ALLOW_HTTP": "true"}
DELTA_RS = f"delta-rs {version_of('deltalake')}"
PYICEBERG = f"pyiceberg {version_of('pyiceberg')}"
MINIO = "MinIO (percolake.tools.s3, one server, single drive) on 127.0.0.1"
MACHINE = f"same {os.cpu_count()}-CPU machine"
#: Where a writer finds MinIO's request count (the bench's parent process reads it).
METRICS_PATH = "/minio/metrics/v3/api/requests"
SPARK_TABLE = "s3_events"


def _copy(source: str, target: str) -> None:
    """One server-side CopyObject: the commit's data object, without uploading it."""
    from spark_integration.spark import filesystem

    fs, src = filesystem.resolve(source)
    _, dst = filesystem.resolve(target)
    fs.copy_file(src, dst)


# --- what a writer process does (built by the deployed benchmark's pool) ---------------


class S3PercolakeWriter(PercolakeWriter):
    """The deployed benchmark's writer on an ``s3://`` table: each commit's data object
    is placed by one server-side CopyObject, in a job folder named as Spark jobs name
    theirs (the start time is in the name, so a commit need not ask S3 for mtimes)."""

    def _folder(self, spec: Spec) -> str:
        from spark_integration.spark.hook import new_job

        return new_job(f"{spec.warehouse}/{spec.table}").staging

    def _size(self, source: str) -> int:
        from spark_integration.spark import filesystem

        return filesystem.file_size(source)

    def _place(self, source: str, path: str) -> None:
        _copy(source, path)


class S3DeltaWriter:
    """delta-rs ``create_write_transaction`` of one ``AddAction``, own ``DeltaTable``."""

    def __init__(self, spec: Spec) -> None:
        from deltalake import DeltaTable

        self.table = DeltaTable(spec.root, storage_options=DELTA_OPTIONS)
        self.schema = _delta_schema()

    def append(self, n: int) -> None:
        from deltalake.transaction import AddAction

        action = AddAction(
            f"part-{n:09d}.parquet", 1000, {}, time.time_ns() // 10**6, True, '{"numRecords":10}'
        )
        self.table.create_write_transaction([action], mode="append", schema=self.schema)

    def extras(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


class S3IcebergWriter:
    """pyiceberg ``add_files`` of one object placed by CopyObject, own catalog object."""

    def __init__(self, spec: Spec) -> None:
        self.catalog = _iceberg_catalog(Path(spec.root), spec.warehouse)
        self.identifier = f"{NAMESPACE}.{spec.table}"
        self.table = self.catalog.load_table(self.identifier)
        self.source = spec.source
        self.folder = f"{spec.warehouse}/data/w{spec.index}"
        self.reloads = 0

    def append(self, n: int) -> None:
        from pyiceberg.exceptions import CommitFailedException

        path = f"{self.folder}/part-{n:09d}.parquet"
        _copy(self.source, path)
        for attempt in range(ICEBERG_ATTEMPTS):
            try:
                self.table.add_files([path], check_duplicate_files=False)
                return
            except CommitFailedException:
                if attempt == ICEBERG_ATTEMPTS - 1:
                    raise
                self.reloads += 1
                self.table = self.catalog.load_table(self.identifier)

    def extras(self) -> dict[str, int]:
        return {"reloads": self.reloads}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.catalog.engine.dispose()


def _delta_schema() -> Any:
    import pyarrow as pa
    from deltalake import Schema

    return Schema.from_arrow(pa.schema([("id", pa.int64())]))


def _iceberg_catalog(root: Path, warehouse: str) -> Any:
    """A SQLite ``SqlCatalog`` in ``root`` whose warehouse is ``warehouse`` on MinIO."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        "bench",
        uri=f"sqlite:///{root}/catalog.db",
        warehouse=warehouse,
        **{
            "s3.endpoint": os.environ["AWS_ENDPOINT_URL"],
            "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"],
            "s3.region": os.environ["AWS_REGION"],
        },
    )


# --- MinIO, its request count, the tables ----------------------------------------------


@contextlib.contextmanager
def minio(root: Path) -> Iterator[str]:
    """MinIO in ``root`` with bucket :data:`BUCKET`, its AWS variables in ``os.environ``
    (writer processes and Spark inherit them), metrics readable without a token;
    stopped and the environment restored on exit. Yields the endpoint URL."""
    from percolake.tools.s3 import S3Server

    saved = {
        name: os.environ.get(name)
        for name in ("MINIO_PROMETHEUS_AUTH_TYPE", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE")
    }
    os.environ["MINIO_PROMETHEUS_AUTH_TYPE"] = "public"  # the launcher passes os.environ on
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        os.environ.pop(name, None)
    server = S3Server(root / "minio")
    try:
        server.start()
        saved.update({name: os.environ.get(name) for name in server.env()})
        os.environ.update(server.env())
        server.create_bucket(BUCKET)
        yield server.endpoint_url
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def s3_requests(endpoint: str) -> int:
    """Every S3 API request MinIO has served so far (its v3 metrics are not cached,
    unlike v2's, which lag by up to 10 s)."""
    with urllib.request.urlopen(endpoint + METRICS_PATH, timeout=10) as answer:
        body = answer.read().decode()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith("minio_api_requests_total{")
        )
    )


def check_delta_refuses_a_lost_race(uri: str) -> None:
    """Two handles at version 0; the second, stale, commits after the first: with
    conditional put it must land at version 2, leaving version 1 as it was."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, create_table_with_add_actions

    schema = _delta_schema()
    create_table_with_add_actions(uri, schema, [], mode="error", storage_options=DELTA_OPTIONS)
    first = DeltaTable(uri, storage_options=DELTA_OPTIONS)
    stale = DeltaTable(uri, storage_options=DELTA_OPTIONS)
    for handle, name in ((first, "a"), (stale, "b")):
        action = AddAction(f"{name}.parquet", 1, {}, time.time_ns() // 10**6, True, "{}")
        handle.create_write_transaction([action], mode="append", schema=schema)
    table = DeltaTable(uri, storage_options=DELTA_OPTIONS)
    files = sorted(Path(u).name for u in table.file_uris())
    if table.version() != 2 or files != ["a.parquet", "b.parquet"]:
        raise AssertionError(
            f"delta-rs with {DELTA_OPTIONS} overwrote a lost race: version "
            f"{table.version()}, files {files}"
        )


def _write_source(path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_integration.spark import filesystem

    fs, inner = filesystem.resolve(path)
    table = pa.table({"id": pa.array(range(SOURCE_ROWS), pa.int64())})
    pq.write_table(table, inner, filesystem=fs)


def _prepare(system: str, root: Path, name: str, seconds: float, gw: str) -> list[Spec]:
    """A new empty table for one run of ``system``; its writers' specs."""
    prefix = f"s3://{BUCKET}/{name}"
    writer = (
        f"{__name__}:"
        + {
            PERCOLAKE: "S3PercolakeWriter",
            DELTA: "S3DeltaWriter",
            ICEBERG: "S3IcebergWriter",
        }[system]
    )
    folder = root / name
    folder.mkdir(parents=True)
    source = f"{prefix}/source/source.parquet"
    if system == PERCOLAKE:
        from pyspark.sql.types import LongType, StructField, StructType

        from spark_integration import Lakehouse
        from txn import TransactionManager

        _write_source(source)
        warehouse = f"{prefix}/warehouse"
        table = f"events_{name}"
        with TransactionManager.remote(gw) as tm:
            Lakehouse(tm, warehouse).create_table(
                table, StructType([StructField("id", LongType())])
            )
        return [
            Spec(system, i, seconds, str(folder), gw, warehouse, table, source, writer=writer)
            for i in range(WRITERS)
        ]
    if system == DELTA:
        from deltalake.transaction import create_table_with_add_actions

        uri = f"{prefix}/delta"
        create_table_with_add_actions(
            uri, _delta_schema(), [], mode="error", storage_options=DELTA_OPTIONS
        )
        return [Spec(system, i, seconds, uri, writer=writer) for i in range(WRITERS)]
    import pyarrow as pa

    _write_source(source)
    warehouse = f"{prefix}/iceberg"
    catalog = _iceberg_catalog(folder, warehouse)
    catalog.create_namespace(NAMESPACE)
    catalog.create_table(f"{NAMESPACE}.events", schema=pa.schema([("id", pa.int64())]))
    catalog.engine.dispose()
    return [
        Spec(system, i, seconds, str(folder), "", warehouse, "events", source, writer=writer)
        for i in range(WRITERS)
    ]


def _files_in_table(system: str, specs: Sequence[Spec]) -> int:
    """How many data files the table holds now, read back from its own metadata."""
    spec = specs[0]
    if system == PERCOLAKE:
        from spark_integration import Lakehouse
        from txn import TransactionManager

        with TransactionManager.remote(spec.gateway) as tm:
            return len(Lakehouse(tm, spec.warehouse).files(spec.table))
    if system == DELTA:
        from deltalake import DeltaTable

        return len(DeltaTable(spec.root, storage_options=DELTA_OPTIONS).file_uris())
    catalog = _iceberg_catalog(Path(spec.root), spec.warehouse)
    try:
        table = catalog.load_table(f"{NAMESPACE}.{spec.table}")
        return len(list(table.scan().plan_files()))
    finally:
        catalog.engine.dispose()


@dataclass(slots=True)
class Appends:
    seconds: float
    runs: int
    results: dict[str, list[Run]] = field(default_factory=dict)
    requests: dict[str, list[int]] = field(default_factory=dict)

    def rates(self, system: str) -> list[float]:
        return [r.rate for r in self.results[system]]


def measure_appends(
    pool: WriterPool,
    endpoint: str,
    root: Path,
    systems: tuple[str, ...],
    seconds: float,
    runs: int,
    progress: Callable[[str], None],
) -> Appends:
    """``runs`` paired runs of every system with 8 writers, order rotated per run."""
    out = Appends(seconds, runs)
    with gateway(f"sqlite:///{root}/store.db", root, "s3-appends") as gw:
        for run in range(runs):
            for system in _rotated(systems, run):
                progress(f"lakehouse.s3.appends.writers8 {system} run {run + 1}/{runs}")
                specs = _prepare(system, root, f"run{run}-{system}", seconds, gw.address)
                before = s3_requests(endpoint)
                got = pool.run(specs, seconds)
                requests = s3_requests(endpoint) - before
                held = _files_in_table(system, specs)
                if held != got.commits:
                    raise AssertionError(
                        f"{system}: {got.commits} commits returned but the table holds "
                        f"{held} files (lost or phantom commits)"
                    )
                out.results.setdefault(system, []).append(got)
                out.requests.setdefault(system, []).append(requests)
                log.info(
                    "s3 %s writers8: %.1f commits/s, %d failed, %.1f S3 requests/commit",
                    system,
                    got.rate,
                    got.failed,
                    requests / max(got.commits, 1),
                )
                if got.failed:
                    log.warning("s3 %s: %d failed, e.g. %s", system, got.failed, got.errors[:1])
    return out


def _topology() -> str:
    return (
        f"{WRITERS} writer processes (multiprocessing spawn, spawn and import time "
        "excluded), each with its own TransactionManager.remote and Lakehouse on an "
        "s3:// warehouse, through one 'percolake serve' process (oracle, locks, gateway) "
        f"on SQLite; the table on {MINIO}; {MACHINE}"
    )


def _anchor(system: str) -> str:
    if system == DELTA:
        return (
            f"Delta Lake ({DELTA_RS}): {WRITERS} writer processes, each with its own "
            "DeltaTable on s3://, create_write_transaction of one AddAction per commit "
            f"(no data object), storage option conditional_put=etag; {MINIO}; {MACHINE}"
        )
    return (
        f"Apache Iceberg ({PYICEBERG} SqlCatalog on SQLite, warehouse s3:// on {MINIO}): "
        f"{WRITERS} writer processes, each with its own catalog object, one CopyObject "
        f"and add_files of one 10-row Parquet object per commit; {MACHINE}"
    )


def append_figures(a: Appends) -> list[Result]:
    how = (
        f"{a.runs} run(s) of {a.seconds:g} s per system, each on a new empty table, system "
        "order rotated per run; every table read back after its run and holding exactly "
        "the committed files"
    )
    ours = "percolake: one CopyObject of a 10-row Parquet object + append_files per commit"
    results: list[Result] = []
    for system, runs in a.results.items():
        prefix = (
            "lakehouse.s3.appends.writers8"
            if system == PERCOLAKE
            else f"{system}.s3.appends.writers8"
        )
        note = (f"{_topology()}; {ours}" if system == PERCOLAKE else _anchor(system)) + f"; {how}"
        anchor = _anchor(DELTA) if system == PERCOLAKE else _anchor(system)
        failed = sum(r.failed for r in runs)
        errors = [e for r in runs for e in r.errors][:2]
        extras = {k: sum(r.extras.get(k, 0) for r in runs) for r in runs for k in r.extras}
        per_commit = [q / max(r.commits, 1) for q, r in zip(a.requests[system], runs, strict=True)]
        results += [
            summarize(f"{prefix}.commits_per_s", "commits/s", anchor, [r.rate for r in runs], note),
            Figure(
                f"{prefix}.failed_commits",
                float(failed),
                "commits",
                len(runs),
                0.0,
                anchor,
                f"{note}; total over the runs"
                + "".join(f", {k} {v}" for k, v in sorted(extras.items()))
                + (f"; first errors: {' | '.join(errors)}" if errors else ""),
            ),
            summarize(
                f"{prefix}.s3_requests_per_commit",
                "requests",
                anchor,
                per_commit,
                f"{note}; MinIO's minio_api_requests_total over the run (from before the "
                "writers open their handles to after the last commit) / successful commits",
            ),
        ]
    theirs = a.rates(DELTA)
    results.append(
        summarize(
            "lakehouse.s3.appends.writers8.vs_deltalake.ratio",
            "x",
            _anchor(DELTA),
            _paired(a.rates(PERCOLAKE), theirs),
            f"{_topology()}; {ours}; against {_anchor(DELTA)} (median "
            f"{sorted(theirs)[len(theirs) // 2]:.1f} commits/s); {how}; percolake commits/s "
            "/ deltalake commits/s of paired runs (back to back)",
        )
    )
    if ICEBERG in a.results:
        results.append(
            summarize(
                "lakehouse.s3.appends.writers8.vs_iceberg.ratio",
                "x",
                _anchor(ICEBERG),
                _paired(a.rates(PERCOLAKE), a.rates(ICEBERG)),
                f"{_topology()}; {ours}; against {_anchor(ICEBERG)}; {how}; percolake "
                "commits/s / iceberg commits/s of paired runs",
            )
        )
    return results


# --- the Spark write -------------------------------------------------------------------

#: The Spark child's longest silence: starting the JVM, or one full-mode job (10M rows
#: through s3a on a loaded 2-core machine); the s3a jars are fetched before it starts.
SPARK_CHILD_SILENCE_S = 900.0

#: What s3a's credential chain and the Spark workers need in the JVM's environment.
SPARK_CHILD_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@dataclass(frozen=True, slots=True)
class SparkTimings:
    """What the Spark child measured: seconds per job by name, and the data's size."""

    seconds: dict[str, list[float]]
    per_job_bytes: float
    plain_bytes: int


def measure_spark(
    root: Path, rows: int, runs: int, progress: Callable[[str], None]
) -> list[Result]:
    """``format("percolake")`` to an ``s3://`` table against ``df.write.parquet`` to
    ``s3a://``, same DataFrame, same session, same bucket; paired runs.

    Spark runs in a fresh ('spawn') child process started now, after :func:`minio`
    put MinIO's AWS variables into ``os.environ``: s3a's credential chain reads the
    JVM's environment, and Spark's Python workers inherit it, both fixed when the JVM
    starts. PySpark keeps one JVM per Python process, so in a process where Spark ran
    before (``python -m bench`` ran earlier Spark suites in one process), every new
    session reused a JVM without the credentials and the s3a write failed with
    "Unable to load credentials from any of the providers in the chain". The
    credentials still never go into the Spark conf (:func:`s3a_conf`).
    """
    from spark_integration.spark.session import s3a_jars

    progress("spark.datasource.s3.write: s3a jars")
    s3a_jars()  # a first fetch (~690 MB) here, outside the child's silence bound
    with gateway(f"sqlite:///{root}/spark-store.db", root, "s3-spark") as gw:
        timings = _in_spark_child(gw.address, rows, runs, progress)
    return spark_figures(timings, rows, runs)


def _in_spark_child(
    gateway_address: str, rows: int, runs: int, progress: Callable[[str], None]
) -> SparkTimings:
    """Run :func:`_spark_child` in a spawned process (our environment, no JVM yet),
    relaying its progress; its error, or its death, fails the benchmark."""

    missing = [name for name in SPARK_CHILD_VARIABLES if not os.environ.get(name)]
    if missing:
        raise RuntimeError(f"the Spark child needs {', '.join(missing)} (MinIO's variables)")
    timings: SparkTimings = run_child(
        _spark_child,
        (gateway_address, rows, runs),
        "s3-spark",
        "the Spark child",
        progress,
        silence_s=SPARK_CHILD_SILENCE_S,
        join_s=30.0,
    )
    return timings


def _spark_child(conn: Connection, gateway_address: str, rows: int, runs: int) -> None:
    """The spawned process: measure, send ``("done", SparkTimings)`` or ``("error",
    traceback)``; progress as ``("progress", step)``."""
    import traceback

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        timings = _spark_timings(
            gateway_address, rows, runs, lambda step: conn.send(("progress", step))
        )
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    else:
        conn.send(("done", timings))
    finally:
        conn.close()


def _spark_timings(
    gateway_address: str, rows: int, runs: int, progress: Callable[[str], None]
) -> SparkTimings:
    """The Spark write itself, in this process's (new) JVM: one warm-up of each job,
    then ``runs`` paired runs, order rotated; the table read back."""
    from spark_integration import Lakehouse, register
    from spark_integration.spark import filesystem
    from spark_integration.spark.session import local_session
    from txn import TransactionManager

    progress("spark.datasource.s3.write: starting Spark")
    warehouse = f"s3://{BUCKET}/spark-warehouse"
    spark = local_session("percolake-bench-s3", **{"spark.driver.memory": "2g"})
    tm = TransactionManager.remote(gateway_address)
    try:
        register(spark)
        df = spark.range(0, rows, 1, 8).selectExpr(
            "id",
            "id % 97 AS k",
            "CAST(id * 7 AS STRING) AS s",
            "rand(1) AS x",
            "sha2(CAST(id AS STRING), 256) AS h",
        )
        lh = Lakehouse(tm, warehouse)
        lh.create_table(SPARK_TABLE, df.schema)
        plain_dirs = (f"s3a://{BUCKET}/plain/{n}" for n in itertools.count())

        def plain() -> float:
            started = time.perf_counter()
            df.write.parquet(next(plain_dirs))
            return time.perf_counter() - started

        def ours() -> float:
            started = time.perf_counter()
            df.write.format("percolake").mode("append").option("gateway", gateway_address).option(
                "warehouse", warehouse
            ).save(SPARK_TABLE)
            return time.perf_counter() - started

        jobs: dict[str, Callable[[], float]] = {"parquet": plain, "percolake": ours}
        progress("spark.datasource.s3.write: warm-up")
        for job in jobs.values():
            job()
        seconds: dict[str, list[float]] = {name: [] for name in jobs}
        for n in range(runs):
            for name in _rotated(list(jobs), n):
                progress(f"spark.datasource.s3.write {name} run {n + 1}/{runs}")
                seconds[name].append(jobs[name]())
        files = lh.files(SPARK_TABLE)
        counted = sum(f.record_count for f in files)
        if counted != (runs + 1) * rows:
            raise AssertionError(f"the s3:// table holds {counted} rows, not {(runs + 1) * rows}")
        return SparkTimings(
            seconds,
            sum(f.size_bytes for f in files) / (runs + 1),
            sum(f.size for f in filesystem.list_files(f"s3://{BUCKET}/plain/0")),
        )
    finally:
        tm.close()
        spark.stop()


def spark_figures(timings: SparkTimings, rows: int, runs: int) -> list[Result]:
    """The Spark write's figures from the child's timings."""
    size = (
        f"{rows:,} rows x 5 columns (bigint, bigint, string, double, 64-char hex string), "
        f"8 partitions, local[2] (one JVM, 2 cores, in its own process); "
        f"{timings.per_job_bytes / 1e6:,.0f} MB of Parquet per percolake job, "
        f"{timings.plain_bytes / 1e6:,.0f} MB per plain job; {runs} paired runs after "
        "one warm-up of each, order rotated; percolake through one 'percolake serve' on "
        f"SQLite; plain Parquet through s3a (spark_integration s3a_conf: hadoop-aws, path "
        f"style, default FileOutputCommitter); both to bucket '{BUCKET}' on {MINIO}; {MACHINE}"
    )
    anchor = (
        "df.write.parquet to s3a:// of the same DataFrame, same session, same MinIO bucket, "
        "same run"
    )
    pp, po = timings.seconds["parquet"], timings.seconds["percolake"]
    return [
        summarize(
            "spark.datasource.s3.write.vs_parquet.ratio",
            "x",
            anchor,
            [o / p for o, p in zip(po, pp, strict=True)],
            size + '; format("percolake") append time (write + commit) / plain Parquet '
            "write time of paired runs (1.0 would be no overhead; lower is better); each "
            "pair, percolake s / Parquet s: "
            + ", ".join(f"{o:.1f}/{p:.1f}" for o, p in zip(po, pp, strict=True)),
        ),
        summarize("spark.datasource.s3.write.seconds", "s", anchor, po, size),
        summarize("spark.datasource.s3.parquet.seconds", "s", anchor, pp, size),
    ]


# --- the suite -------------------------------------------------------------------------


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    seconds = 2.0 if quick else 8.0
    runs = 1 if quick else 3
    systems = (PERCOLAKE, DELTA, ICEBERG)
    rows = 200_000 if quick else 10_000_000
    spark_runs = 1 if quick else 5
    load = MachineLoad()
    progress("lakehouse.s3: starting MinIO")
    with tempfile.TemporaryDirectory(prefix="percolake-s3-bench-") as tmp:
        root = Path(tmp)
        with minio(root) as endpoint:
            check_delta_refuses_a_lost_race(f"s3://{BUCKET}/delta-race-check")
            progress("lakehouse.s3.appends: starting writer processes")
            with WriterPool(WRITERS, systems) as pool:
                appends = measure_appends(pool, endpoint, root, systems, seconds, runs, progress)
            results = append_figures(appends)
            results += measure_spark(root, rows, spark_runs, progress)
    # How busy the shared machine was: the suite's own processes and anything else.
    return load.stamp(results)


def main(argv: Sequence[str] | None = None) -> int:
    from bench.__main__ import finish_command

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="merge into bench/results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    results = run(args.quick, progress=lambda n: print("running", n, flush=True))
    return finish_command(results, started=started, write=args.write, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
