"""Reads of the change data feed (option ``readChangeFeed``): the files of a
:class:`~spark_integration.spark.changes.ChangePlan`, planned on the driver and read by
tasks with pyarrow, like a snapshot read (``batch_read``).

A batch read pins its versions when the DataFrame is defined. A streaming read
(``readStream`` with ``readChangeFeed``) reads the changes of each version from
``startingVersion`` on, as they commit. Its offset is the next file to read, file
``index`` of version ``version``'s files in plan order (:func:`change_files`), as the
plain streaming read's offset is (``stream_read``): without ``maxFilesPerTrigger`` a
micro-batch reads every version committed since the last one; with it, whole versions
while their files fit in that many, and always at least one version. Unlike the plain
read, a version's change files are never split between micro-batches, as Delta admits
a commit's change files whole: a consumer that maintains a view from the feed never
sees an update's pre-image without its post-image, or half of a statement.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_integration.spark.changes import (
    CHANGE_TYPE,
    FEED_COLUMNS,
    ChangePlan,
    change_file_schema,
    feed_schema,
    plan_changes,
)
from spark_integration.spark.datasource.batch_read import (
    READ_MIN_SPLITS,
    READ_SPLIT_BYTES,
    files_to_read,
)
from spark_integration.spark.datasource.files import FileToRead, read_files
from spark_integration.spark.datasource.gateway import open_gateway
from spark_integration.spark.datasource.options import ChangeFeedOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChangeFile:
    """One file of the feed: its rows are all ``change_type`` (``None``: a change file,
    whose rows carry their own ``_change_type``), of ``version`` committed at ``ms``."""

    file: FileToRead
    change_type: str | None
    version: int
    timestamp_ms: int


class _Split(InputPartition):
    """The files of one read task, with what a task needs to read them: a streaming
    read's tasks run a reader made afresh, which knows nothing the driver's learned."""

    def __init__(
        self, files: tuple[ChangeFile, ...], schema_json: str, partition_by: tuple[str, ...]
    ) -> None:
        super().__init__(len(files))
        self.files = files
        self.schema_json = schema_json  # the table's columns, without the feed's
        self.partition_by = partition_by


def change_reader(
    opts: ChangeFeedOptions, end: int | None, *, batch: bool = False
) -> tuple[int, PercolakeChangeReader]:
    """The reader of ``opts``'s versions up to ``end`` (``None``: the latest), planned
    through the gateway; returns the last version it reads too (to pin the read).
    ``batch``: for a batch read, which refuses the streaming-only option."""
    if batch and opts.max_files is not None:
        raise ValueError(
            "percolake: option maxFilesPerTrigger is for streaming reads; a batch change "
            "feed read takes startingVersion and endingVersion"
        )
    plan = _plan(opts, opts.starting_version, end)
    schema_json = plan.schema.json()
    reader = PercolakeChangeReader(opts.table, schema_json, plan.meta.partition_by, plan)
    return plan.end, reader


def _plan(opts: ChangeFeedOptions, start: int, end: int | None) -> ChangePlan:
    with open_gateway(opts.gateway) as catalog:
        return plan_changes(catalog, opts.table, start, end)


def change_files(plan: ChangePlan) -> list[ChangeFile]:
    """The plan's files in version order, as tasks read them."""
    return [
        ChangeFile(file, piece.change_type, piece.version, piece.timestamp_ms)
        for piece in plan.pieces
        for file in files_to_read(plan.meta.location, piece.files)
    ]


def splits(plan: ChangePlan, schema_json: str) -> list[_Split]:
    """The plan's files as read tasks of about ``READ_SPLIT_BYTES`` each (greedy)."""
    return split_changes(change_files(plan), schema_json, plan.meta.partition_by)


def split_changes(
    files: list[ChangeFile], schema_json: str, partition_by: tuple[str, ...]
) -> list[_Split]:
    """``files`` as read tasks of about ``READ_SPLIT_BYTES`` each (greedy)."""
    total = sum(f.file.size_bytes for f in files)
    count = min(len(files), max(READ_MIN_SPLITS, -(-total // READ_SPLIT_BYTES)))
    groups: list[list[ChangeFile]] = [[] for _ in range(count)]
    loads = [0] * count
    for item in sorted(files, key=lambda f: f.file.size_bytes, reverse=True):
        smallest = loads.index(min(loads))
        groups[smallest].append(item)
        loads[smallest] += item.file.size_bytes
    return [_Split(tuple(g), schema_json, partition_by) for g in groups if g]


def read_split(partition: InputPartition) -> Iterator[Any]:
    """A task's rows: each file's, with the feed's three columns."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    assert isinstance(partition, _Split)
    schema = StructType.fromJson(json.loads(partition.schema_json))
    plain = to_arrow_schema(schema, timezone="UTC")
    with_type = to_arrow_schema(change_file_schema(schema), timezone="UTC")
    out = to_arrow_schema(feed_schema(schema), timezone="UTC")
    width = len(schema.fields)
    for item in partition.files:
        target = with_type if item.change_type is None else plain
        for batch in read_files((item.file,), target, partition.partition_by):
            rows = batch.num_rows
            change = (
                batch.column(CHANGE_TYPE)
                if item.change_type is None
                else pa.array([item.change_type] * rows, pa.string())
            )
            version = pa.array([item.version] * rows, pa.int64())
            stamp = pa.array([item.timestamp_ms * 1000] * rows, pa.int64())
            columns = [batch.column(i) for i in range(width)]
            arrays = [*columns, change, version, stamp.cast(out.field(width + 2).type)]
            yield pa.RecordBatch.from_arrays(arrays, schema=out)


class PercolakeChangeReader(DataSourceReader):
    """The change rows of a range of versions, listed once at planning."""

    def __init__(
        self, table: str, schema_json: str, partition_by: tuple[str, ...], plan: ChangePlan
    ) -> None:
        self.table = table
        self.schema_json = schema_json  # the table's columns, without the feed's
        self.partition_by = partition_by
        self.plan = plan

    def partitions(self) -> Sequence[InputPartition]:
        tasks = splits(self.plan, self.schema_json)
        log.info("change feed of %s: %d read tasks", self.table, len(tasks))
        return tasks or [_Split((), self.schema_json, self.partition_by)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_split(partition)


@dataclass(frozen=True, slots=True)
class _At:
    """Where a streaming feed stands: the next file is file ``index`` of ``version``'s
    files. An offset is this as JSON; one without ``index`` (written before the feed
    honoured ``maxFilesPerTrigger``) is the start of its version. The reader itself
    only ends micro-batches between versions (``index`` 0)."""

    version: int
    index: int = 0

    def offset(self) -> dict[str, Any]:
        return {"version": self.version, "index": self.index}

    @classmethod
    def of(cls, offset: dict[str, Any]) -> _At:
        return cls(int(offset["version"]), int(offset.get("index", 0)))


class PercolakeChangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The change feed as a stream, version by version; ``maxFilesPerTrigger`` bounds
    a micro-batch's files, whole versions only (at least one).

    Versions are immutable once committed, so each version's change files are planned
    once (a range at a time, through ``plan_changes``) and kept until a committed
    offset passes them.
    """

    def __init__(self, opts: ChangeFeedOptions, schema: StructType) -> None:
        if opts.ending_version is not None:
            raise ValueError("percolake: endingVersion is for batch change feed reads")
        self.opts = opts
        table = [f for f in schema.fields if f.name not in FEED_COLUMNS]
        self.schema_json = StructType(table).json()  # the query's, fixed when it starts
        self.partition_by: tuple[str, ...] = ()
        #: Each planned version's files, in plan order.
        self._files: dict[int, list[ChangeFile]] = {}
        #: With ``Trigger.AvailableNow``: the last version this run reads.
        self._until: int | None = None

    def _head(self) -> int:
        with open_gateway(self.opts.gateway) as catalog:
            prepared = catalog.prepare(self.opts.table)
        self.partition_by = prepared.meta.partition_by
        return prepared.head.version

    def _version_files(self, version: int, last: int) -> list[ChangeFile]:
        """The files of ``version``; an unplanned one is planned in one go with the
        versions after it up to ``last`` (a range's log records and rows)."""
        if version not in self._files:
            plan = _plan(self.opts, version, max(version, last))
            self.partition_by = plan.meta.partition_by
            planned: dict[int, list[ChangeFile]] = {v: [] for v in range(plan.start, plan.end + 1)}
            for item in change_files(plan):
                planned[item.version].append(item)
            for v, files in planned.items():
                self._files.setdefault(v, files)
        return self._files[version]

    def initialOffset(self) -> dict[str, Any]:
        return _At(self.opts.starting_version).offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._head()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_files is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.opts.max_files)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        head = self._head()
        last = head if self._until is None else min(self._until, head)
        at = _At.of(start)
        if not isinstance(limit, ReadMaxFiles):
            return at.offset() if last < at.version else _At(last + 1).offset()
        budget, admitted = limit.max_files, False
        while at.version <= last:
            window = min(last, at.version + max(budget, 1) - 1)  # a file or none each
            left = len(self._version_files(at.version, window)) - at.index
            if admitted and left > budget:
                break  # the next version's files go whole into a later micro-batch
            at, budget, admitted = _At(at.version + 1), budget - left, True
            if budget <= 0:
                break
        return at.offset()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return _At(self._head() + 1).offset()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, stop = _At.of(start), _At.of(end)
        last = stop.version if stop.index else stop.version - 1
        picked: list[ChangeFile] = []
        at = first
        while (at.version, at.index) < (stop.version, stop.index):
            files = self._version_files(at.version, last)
            upto = stop.index if at.version == stop.version else len(files)
            picked += files[at.index : upto]
            at = _At(at.version + 1)
        log.info(
            "change feed stream of %s: from %s to %s, %d files",
            self.opts.table,
            first.offset(),
            stop.offset(),
            len(picked),
        )
        return split_changes(picked, self.schema_json, self.partition_by)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_split(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Versions before the committed offset are never read again: forget their files."""
        done = _At.of(end).version
        for version in [v for v in self._files if v < done]:
            del self._files[version]
