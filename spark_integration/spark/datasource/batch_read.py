"""Batch reads: a version pinned when the DataFrame is defined, its files spread over tasks."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from spark_integration.engine.errors import VersionNotFoundError
from spark_integration.engine.locations import join
from spark_integration.engine.model import FileEntry
from spark_integration.spark.datasource.files import FileToRead, read_files, split_files
from spark_integration.spark.datasource.gateway import GatewayCatalog
from spark_integration.spark.datasource.options import ReadOptions
from spark_integration.spark.datasource.pruning import Candidate, prune

log = logging.getLogger(__name__)

#: Read tasks of about this many bytes of Parquet each, at least two while there are files.
READ_SPLIT_BYTES = 128 << 20
READ_MIN_SPLITS = 2


class _Split(InputPartition):
    def __init__(self, files: tuple[FileToRead, ...]) -> None:
        super().__init__(len(files))
        self.files = files


class PercolakeReader(DataSourceReader):
    """A pinned snapshot: the files were listed once, at planning, on the driver."""

    def __init__(
        self,
        table: str,
        schema_json: str,
        partition_by: tuple[str, ...],
        files: list[FileToRead],
    ) -> None:
        self.table = table
        self.schema_json = schema_json
        self.partition_by = partition_by
        self.files = files

    def partitions(self) -> Sequence[InputPartition]:
        groups = split_files(self.files, READ_SPLIT_BYTES, READ_MIN_SPLITS)
        log.info("read of %s: %d files in %d tasks", self.table, len(self.files), len(groups))
        # Spark wants at least one partition; an empty table reads one with no files.
        return [_Split(tuple(group)) for group in groups] or [_Split(())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, _Split)
        schema = StructType.fromJson(json.loads(self.schema_json))
        target = to_arrow_schema(schema, timezone="UTC")
        yield from read_files(partition.files, target, self.partition_by)


class PercolakePushdownReader(PercolakeReader):
    """A snapshot read that drops the files a query's filters rule out (``pushFilters``).

    Filters on partition columns are decided per file and not returned; filters on
    data columns skip files whose column statistics prove no row matches, and go back
    to Spark for the rows of the files kept (see ``pruning``).
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        schema = StructType.fromJson(json.loads(self.schema_json))
        candidates = [Candidate(f.partition, f.record_count, f.stats) for f in self.files]
        pruned = prune(candidates, filters, schema, self.partition_by)
        log.info(
            "read of %s: %d filters pushed, %d of %d files kept, %d filters left to Spark",
            self.table,
            len(filters),
            len(pruned.kept),
            len(self.files),
            len(pruned.remaining),
        )
        self.files = [self.files[i] for i in pruned.kept]
        return pruned.remaining


#: The PySpark worker that plans a read with filter pushdown. Spark runs it instead of
#: its plain read planner only when the session sets
#: ``spark.sql.python.filterPushdown.enabled``; the plain planner fails every read of
#: a reader that implements ``pushFilters``, and a data source cannot read the
#: session's configuration. So the reader with ``pushFilters`` goes only to this worker.
_PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"


def planning_with_pushdown() -> bool:
    """Whether Spark's filter pushdown worker called this (looked up on the stack).

    A PySpark that renamed the worker only loses the pruning: the plain reader is
    always safe.
    """
    frame = inspect.currentframe()
    while frame is not None:
        spec = frame.f_globals.get("__spec__")
        if _PUSHDOWN_WORKER in (frame.f_globals.get("__name__"), getattr(spec, "name", None)):
            return True
        frame = frame.f_back
    return False


def resolve_version(catalog: GatewayCatalog, opts: ReadOptions) -> int:
    head = catalog.prepare(opts.table).head
    if opts.version is not None:
        if opts.version > head.version:
            raise VersionNotFoundError(
                f"percolake: table {opts.table!r} has no version {opts.version} "
                f"(latest is {head.version})"
            )
        return opts.version
    if opts.timestamp_ms is None:
        return head.version
    # The gateway binary-searches the log's never-decreasing commit times; a time
    # before the table or in the future raises VersionNotFoundError.
    return catalog.version_at(opts.table, opts.timestamp_ms)


def files_to_read(location: str, entries: Sequence[FileEntry]) -> list[FileToRead]:
    """The log's entries as files to read: each path is the table's location (a local
    folder or ``s3://bucket/prefix``) joined with the entry's relative path."""
    return [
        FileToRead(join(location, e.path), e.size_bytes, e.partition, e.record_count, e.stats)
        for e in entries
    ]
