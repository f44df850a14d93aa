"""The anchors of the lakehouse benchmark: Delta Lake (delta-rs) and Apache Iceberg
(pyiceberg on a SQLite ``SqlCatalog`` with a local file warehouse).

Each class wraps one table of one system on local disk, in the shapes the benchmark
needs: one-file metadata-only commits, cold listings, cold snapshot reads, and
commits of Parquet files that Spark wrote. ``bench.bench_lakehouse`` drives them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._results import versions

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

NAMESPACE = "bench"
#: Outer bound on one Iceberg commit: pyiceberg retries a conflict itself (4 times
#: with backoff from 100 ms); when it still gives up we reload the table and retry.
ICEBERG_ATTEMPTS = 20


def version_of(package: str) -> str:
    return versions([package]).get(package, "?")


def local_path(uri: str) -> str:
    """A local path from what a table lists (a plain path or a ``file://`` URI)."""
    return uri.removeprefix("file://")


def footer_rows(paths: Sequence[str]) -> int:
    """Rows in these Parquet files, from their footers."""
    import pyarrow.parquet as pq

    return sum(int(pq.ParquetFile(local_path(p)).metadata.num_rows) for p in paths)


# --- pyiceberg's own conflict retries --------------------------------------------------


class _RetryCounter(logging.Filter):
    """Counts pyiceberg's "retrying" warnings and keeps them off the console."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Commit failed due to a concurrent update"):
            with self._lock:
                self.count += 1
            return False
        return True


@contextlib.contextmanager
def pyiceberg_retries() -> Iterator[_RetryCounter]:
    """While inside: count pyiceberg's internal commit retries, and silence their
    warnings (they come from the ``pyiceberg.table`` logger, once per retry)."""
    counter = _RetryCounter()
    logger = logging.getLogger("pyiceberg.table")
    logger.addFilter(counter)
    try:
        yield counter
    finally:
        logger.removeFilter(counter)


# --- Delta Lake ------------------------------------------------------------------------


class DeltaAppends:
    """A delta-rs table with one ``id BIGINT`` column in ``root/delta``, for
    metadata-only one-file commits and cold listings.

    ``create=False`` opens the table another process created (a writer process of
    the deployed-topology benchmark)."""

    def __init__(self, root: Path, *, create: bool = True) -> None:
        import pyarrow as pa
        from deltalake import Schema
        from deltalake.transaction import create_table_with_add_actions

        self.path = str(root / "delta")
        self.schema = Schema.from_arrow(pa.schema([("id", pa.int64())]))
        if create:
            create_table_with_add_actions(self.path, self.schema, [], mode="error")
        self._local = threading.local()

    def open(self) -> None:
        """This thread's own ``DeltaTable`` handle, loaded before the clock starts."""
        from deltalake import DeltaTable

        self._local.table = DeltaTable(self.path)

    def append(self, n: int) -> None:
        from deltalake.transaction import AddAction

        if getattr(self._local, "table", None) is None:
            self.open()
        action = AddAction(
            f"part-{n:08d}.parquet", 1000, {}, time.time_ns() // 10**6, True, '{"numRecords":10}'
        )
        self._local.table.create_write_transaction([action], mode="append", schema=self.schema)

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


class DeltaSnapshots:
    """A delta-rs table in ``root/delta-snapshots``: version 0 empty, then one
    ``write_deltalake(mode="append")`` per batch, so version ``v`` holds ``v`` batches."""

    def __init__(self, root: Path, schema: Any) -> None:
        from deltalake import DeltaTable

        self.path = str(root / "delta-snapshots")
        DeltaTable.create(self.path, schema, mode="error")

    def append(self, batch: Any) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.path, batch, mode="append")

    def read_cold(self, version: int | None) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(self.path, version=version).to_pyarrow_table()


class DeltaSparkCommits:
    """A delta-rs table in ``root/delta-spark`` that Spark jobs write into: each job's
    ``df.write.parquet(<table>/job-<n>)`` output becomes one delta-rs commit."""

    def __init__(self, root: Path, arrow_schema: Any) -> None:
        from deltalake import DeltaTable, Schema
        from deltalake.transaction import create_table_with_add_actions

        self.path = str(root / "delta-spark")
        self.schema = Schema.from_arrow(arrow_schema)
        create_table_with_add_actions(self.path, self.schema, [], mode="error")
        self.table = DeltaTable(self.path)
        self.jobs = 0

    def next_job_dir(self) -> str:
        self.jobs += 1
        return f"{self.path}/job-{self.jobs:04d}"

    def commit(self, job_dir: str) -> None:
        """One append adding every part file of the job: sizes and times from the
        file system, row counts from the Parquet footers."""
        import pyarrow.parquet as pq
        from deltalake.transaction import AddAction, RemoveAction

        actions: list[AddAction | RemoveAction] = []
        for part in sorted(Path(job_dir).glob("part-*.parquet")):
            stat = part.stat()
            rows = pq.ParquetFile(str(part)).metadata.num_rows
            actions.append(
                AddAction(
                    os.path.relpath(part, self.path),
                    stat.st_size,
                    {},
                    stat.st_mtime_ns // 10**6,
                    True,
                    json.dumps({"numRecords": rows}),
                )
            )
        self.table.create_write_transaction(actions, mode="append", schema=self.schema)

    def rows(self) -> int:
        from deltalake import DeltaTable

        return int(DeltaTable(self.path).to_pyarrow_dataset().count_rows())


# --- Apache Iceberg --------------------------------------------------------------------


class Iceberg:
    """One pyiceberg table ``bench.<name>`` in a SQLite ``SqlCatalog`` whose warehouse
    is the local folder ``root/<name>``; ``create=False`` opens the one another
    process created."""

    def __init__(self, root: Path, name: str, arrow_schema: Any, *, create: bool = True) -> None:
        self.root = root / name
        self.identifier = f"{NAMESPACE}.{name}"
        if create:
            self.root.mkdir()
            with self.catalog() as catalog:
                catalog.create_namespace(NAMESPACE)
                table = catalog.create_table(self.identifier, schema=arrow_schema)
        else:
            with self.catalog() as catalog:
                table = catalog.load_table(self.identifier)
        self.location = local_path(table.location())

    def catalog(self) -> SqlCatalog:
        """A new catalog object (its own SQLite engine); close it after use."""
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(
            NAMESPACE,
            uri=f"sqlite:///{self.root}/catalog.db",
            warehouse=f"file://{self.root}",
        )

    @contextlib.contextmanager
    def table(self) -> Iterator[Table]:
        """The table, loaded through a fresh catalog (cold)."""
        with self.catalog() as catalog:
            yield catalog.load_table(self.identifier)


class IcebergAppends(Iceberg):
    """An Iceberg table with one ``id BIGINT`` column, for one-file commits.

    Each commit is ``Table.add_files([path], check_duplicate_files=False)``, a fast
    append of one new manifest. ``add_files`` reads the file's Parquet footer, so
    every path is a fresh hard link of one 10-row file written up front.
    """

    def __init__(self, root: Path, *, create: bool = True) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([("id", pa.int64())])
        super().__init__(root, "iceberg", schema, create=create)
        self.data = Path(self.location) / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.source = str(self.root / "source.parquet")
        if create:
            pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}, schema), self.source)
        self._shared = self.catalog()
        self._local = threading.local()
        self._lock = threading.Lock()
        #: Commits that escaped pyiceberg's own retries and were retried here.
        self.reloads = 0

    def open(self) -> None:
        """This thread's own table handle, loaded before the clock starts."""
        self._local.table = self._shared.load_table(self.identifier)

    def append(self, n: int) -> None:
        from pyiceberg.exceptions import CommitFailedException

        if getattr(self._local, "table", None) is None:
            self.open()
        path = str(self.data / f"part-{n:08d}.parquet")
        os.link(self.source, path)
        for attempt in range(ICEBERG_ATTEMPTS):
            try:
                self._local.table.add_files([path], check_duplicate_files=False)
                return
            except CommitFailedException:
                if attempt == ICEBERG_ATTEMPTS - 1:
                    raise
                with self._lock:
                    self.reloads += 1
                self.open()

    def list_cold(self) -> tuple[float, int]:
        """Live files from a fresh catalog object: load the table, plan a full scan."""
        started = time.perf_counter()
        with self.table() as table:
            count = len([task.file.file_path for task in table.scan().plan_files()])
            took = time.perf_counter() - started
        return took, count

    def close(self) -> None:
        self._shared.close()


class IcebergSnapshots(Iceberg):
    """An Iceberg table with one ``Table.append(batch)`` per batch: snapshot ``v``
    (in commit order) holds ``v`` batches."""

    def __init__(self, root: Path, arrow_schema: Any) -> None:
        super().__init__(root, "iceberg_snapshots", arrow_schema)

    def fill(self, batches: Sequence[Any]) -> None:
        with self.table() as table:
            for batch in batches:
                table.append(batch)

    def snapshot_ids(self) -> list[int]:
        """Snapshot ids in commit order, checked against the parent chain."""
        with self.table() as table:
            snapshots = table.metadata.snapshots
        for parent, child in itertools.pairwise(snapshots):
            assert child.parent_snapshot_id == parent.snapshot_id
        return [s.snapshot_id for s in snapshots]

    def read_cold(self, snapshot_id: int) -> Any:
        with self.table() as table:
            return table.scan(snapshot_id=snapshot_id).to_arrow()


class IcebergSparkCommits(Iceberg):
    """An Iceberg table that Spark jobs write into: each job's
    ``df.write.parquet(<staging>)`` output is committed with one ``add_files``."""

    def __init__(self, root: Path, arrow_schema: Any) -> None:
        super().__init__(root, "iceberg_spark", arrow_schema)
        self.catalog_handle = self.catalog()
        self.handle = self.catalog_handle.load_table(self.identifier)
        self.jobs = 0

    def next_job_dir(self) -> str:
        self.jobs += 1
        return f"{self.location}/data/job-{self.jobs:04d}"

    def commit(self, job_dir: str) -> None:
        paths = [str(p) for p in sorted(Path(job_dir).glob("part-*.parquet"))]
        self.handle.add_files(paths, check_duplicate_files=False)

    def rows(self) -> int:
        with self.table() as table:
            return footer_rows([task.file.file_path for task in table.scan().plan_files()])

    def close(self) -> None:
        self.catalog_handle.close()
