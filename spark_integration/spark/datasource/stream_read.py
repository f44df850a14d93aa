"""Streaming reads: committed versions in order, file by file, as Delta reads them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_integration.engine.errors import (
    ChangeCommitError,
    VersionNotFoundError,
    VersionVacuumedError,
)
from spark_integration.engine.model import OPTIMIZE, FileEntry, Head
from spark_integration.engine.retention import describe_s
from spark_integration.spark import filesystem
from spark_integration.spark.datasource.batch_read import (
    READ_MIN_SPLITS,
    READ_SPLIT_BYTES,
    files_to_read,
)
from spark_integration.spark.datasource.files import FileToRead, read_files, split_files
from spark_integration.spark.datasource.gateway import open_gateway
from spark_integration.spark.datasource.options import StreamReadOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Position:
    """Where a streaming read stands: the next file is file ``index`` of version ``version``.

    The files of a version are the files it added, or with ``snapshot`` every file
    of the table at that version (the first version of a read without
    ``startingVersion``). Offsets are this as a JSON object; only the position's own
    version can be a snapshot, the versions after it are always read as changes.
    """

    version: int
    index: int
    snapshot: bool

    def offset(self) -> dict[str, Any]:
        return {"version": self.version, "index": self.index, "snapshot": self.snapshot}

    @classmethod
    def of(cls, offset: dict[str, Any]) -> _Position:
        return cls(int(offset["version"]), int(offset["index"]), bool(offset["snapshot"]))


@dataclass(frozen=True, slots=True)
class _StreamFile:
    version: int
    file: FileToRead


class _StreamSplit(InputPartition):
    """The files of one read task, with what a task needs to read them.

    The table's partition columns travel with the split: Spark's read tasks run a
    reader made afresh by ``streamReader`` (never the driver's, which learned them
    from the gateway), so a value kept only on the driver's reader is lost there.
    """

    def __init__(self, files: tuple[_StreamFile, ...], partition_by: tuple[str, ...]) -> None:
        super().__init__(len(files))
        self.files = files
        self.partition_by = partition_by


class PercolakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Committed versions in order, file by file; ``maxFilesPerTrigger`` bounds a micro-batch.

    Versions are immutable once committed, so the files of each are fetched once
    (from the gateway's history, or its file list for a snapshot) and kept.
    """

    def __init__(self, opts: StreamReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema_json = schema.json()
        self.partition_by: tuple[str, ...] = ()
        self.location = ""
        self._changes: dict[int, list[FileToRead]] = {}
        self._snapshots: dict[int, list[FileToRead]] = {}
        #: Versions that removed files, and their operation.
        self._change_commits: dict[int, str] = {}
        #: Versions below the oldest readable one whose added files were all found.
        self._present: set[int] = set()
        #: With ``Trigger.AvailableNow``: the last version this run reads.
        self._until: int | None = None

    # -- driver side ------------------------------------------------------------------

    def _head(self) -> Head:
        with open_gateway(self.opts.gateway) as catalog:
            prepared = catalog.prepare(self.opts.table)
        self.partition_by = prepared.meta.partition_by
        self.location = prepared.meta.location
        return prepared.head

    def initialOffset(self) -> dict[str, Any]:
        head = self._head()
        opts = self.opts
        if opts.starting_version is not None:
            if opts.starting_version > head.version + 1:
                raise VersionNotFoundError(
                    f"percolake: startingVersion {opts.starting_version} of table "
                    f"{opts.table!r} is beyond its latest version {head.version}"
                )
            return _Position(opts.starting_version, 0, False).offset()
        if opts.only_new:
            return _Position(head.version + 1, 0, False).offset()
        return _Position(head.version, 0, True).offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._head().version

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_files is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.opts.max_files)

    def _files(self, version: int, snapshot: bool, head: Head) -> list[FileToRead]:
        """The files a read of ``version`` takes (all of its snapshot, or what it added)."""
        cache = self._snapshots if snapshot else self._changes
        outdated = version < head.min_readable_version
        if version not in cache:
            # Below min_readable_version a snapshot is gone: retention expired the
            # version or vacuum removed files (a restart from a checkpoint whose offset
            # is that snapshot); a version's own added files may still all be there (an
            # append that no overwrite replaced), so they are looked for.
            if outdated and snapshot:
                raise self._unreadable_snapshot(version, head)
            self._fetch(version, snapshot, head)
            if version not in cache:
                # History leaves out only what retention expired (every version up
                # to the head has a log record until then): never read it as empty.
                raise self._expired(version)
        if outdated and version not in self._present:
            if not all(filesystem.exists(f.path) for f in cache.get(version, [])):
                raise self._vacuumed(version, head)
            self._present.add(version)
        removed_by = self._change_commits.get(version)
        if not snapshot and removed_by is not None and not self.opts.skip_change_commits:
            raise ChangeCommitError(
                f"percolake: version {version} of table {self.opts.table!r} is an "
                f"{removed_by} that removed files; a streaming read takes only versions "
                "that add files. Set option skipChangeCommits=true to skip such versions"
            )
        return cache.get(version, [])

    def _unreadable_snapshot(
        self, version: int, head: Head
    ) -> VersionNotFoundError | VersionVacuumedError:
        """Why the snapshot of ``version``, below the oldest readable version, is gone.

        Retention raised the head's ``min_readable_version`` past it (the version
        expired: history, asked afresh, leaves it out, and its files may well still
        exist), or vacuum's fence did (history still lists it, its files may be gone).
        """
        with open_gateway(self.opts.gateway) as catalog:
            listed = any(e.record.version == version for e in catalog.history(self.opts.table))
        return self._vacuumed(version, head) if listed else self._expired(version)

    def _vacuumed(self, version: int, head: Head) -> VersionVacuumedError:
        return VersionVacuumedError(
            f"percolake: version {version} of table {self.opts.table!r} is no longer "
            "readable: vacuum removed its files (the oldest fully readable version is "
            f"{head.min_readable_version}); restart the query with a new checkpoint and a "
            "later startingVersion"
        )

    def _expired(self, version: int) -> VersionNotFoundError:
        with open_gateway(self.opts.gateway) as catalog:
            readable = catalog.prepare(self.opts.table).head.min_readable_version
            retention = catalog.retention(self.opts.table)
        return VersionNotFoundError(
            f"percolake: the stream cannot read version {version} of table "
            f"{self.opts.table!r}: it expired under the table's log retention "
            f"({describe_s(retention.log_retention_s)}), which removed its log and file "
            f"records (versions from {readable} on are readable). Restart the query with a "
            f"new checkpoint and startingVersion={readable} or later; to keep versions "
            "for streams that stay down longer, raise the retention (Lakehouse.set_retention)"
        )

    def _fetch(self, version: int, snapshot: bool, head: Head) -> None:
        with open_gateway(self.opts.gateway) as catalog:
            if snapshot:
                meta, _, entries = catalog.files(self.opts.table, version, FileEntry)
                self._snapshots[version] = files_to_read(meta.location, entries)
                return
            location = catalog.meta(self.opts.table).location
            for entry in catalog.history(self.opts.table):
                record = entry.record
                if record.version in self._changes or record.version > head.version:
                    continue
                if record.operation == OPTIMIZE:
                    # A compaction changes no row: its files repeat rows already read,
                    # so the stream skips it whatever skipChangeCommits says.
                    self._changes[record.version] = []
                elif entry.removed:
                    # A skipped change commit reads nothing: its added files repeat
                    # rows the stream has already seen.
                    self._change_commits[record.version] = record.operation
                    self._changes[record.version] = []
                else:
                    self._changes[record.version] = files_to_read(location, entry.added)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        head = self._head()
        last = head.version if self._until is None else min(self._until, head.version)
        budget = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        at = _Position.of(start)
        while at.version <= last:
            left = len(self._files(at.version, at.snapshot, head)) - at.index
            if budget is not None and left > budget:
                return _Position(at.version, at.index + budget, at.snapshot).offset()
            at = _Position(at.version + 1, 0, False)
            if budget is not None:
                budget -= left
                if budget == 0:
                    break
        return at.offset()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return _Position(self._head().version + 1, 0, False).offset()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        head = self._head()
        first, stop = _Position.of(start), _Position.of(end)
        picked: list[_StreamFile] = []
        at = first
        while (at.version, at.index) < (stop.version, stop.index):
            files = self._files(at.version, at.snapshot, head)
            upto = stop.index if at.version == stop.version else len(files)
            picked += [_StreamFile(at.version, f) for f in files[at.index : upto]]
            at = _Position(at.version + 1, 0, False)
        by_path = {f.file.path: f for f in picked}
        groups = split_files([f.file for f in picked], READ_SPLIT_BYTES, READ_MIN_SPLITS)
        log.info(
            "stream of %s: versions %d..%d, %d files in %d tasks",
            self.opts.table,
            first.version,
            stop.version,
            len(picked),
            len(groups),
        )
        return [
            _StreamSplit(tuple(by_path[f.path] for f in group), self.partition_by)
            for group in groups
        ]

    def commit(self, end: dict[str, Any]) -> None:
        # Versions before the committed offset are never read again: forget their files.
        done = _Position.of(end).version
        for cache in (self._changes, self._snapshots):
            for version in [v for v in cache if v < done]:
                del cache[version]

    # -- executors ----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, _StreamSplit)
        schema = StructType.fromJson(json.loads(self.schema_json))
        target = to_arrow_schema(schema, timezone="UTC")
        for item in partition.files:
            if not filesystem.exists(item.file.path):
                raise VersionVacuumedError(
                    f"percolake: file {item.file.path} of version {item.version} of table "
                    f"{self.opts.table!r} is gone (vacuumed?); the stream cannot read that "
                    "version"
                )
            yield from read_files([item.file], target, partition.partition_by)
