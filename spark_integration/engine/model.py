"""What a lakehouse table is made of, and how each piece is encoded in percolake cells.

Every piece of table metadata is a cell of one of six percolake tables, all named
``<catalog>.<kind>`` (``lakehouse.head`` by default). Rows start with the table's
name and a NUL byte (names cannot contain NUL), so one table's rows form one
contiguous range and fixed-width big-endian integers after it sort numerically.

========== ======================================== ===============================
kind       row                                      value (JSON)
========== ======================================== ===============================
``tables`` ``name``                                 :class:`TableMeta`
``head``   ``name``                                 :class:`Head`: current version
``log``    ``name NUL version``                     :class:`LogRecord`, column ``c``;
                                                    its commit timestamp, column ``ts``
``files``  ``name NUL gen version index``           :class:`FileEntry` (and its
                                                    :class:`ColumnStats`, if any),
                                                    column ``f``: a file added; column
                                                    ``r`` (index from ``REMOVE_INDEX``):
                                                    a file that version removed
``gens``   ``name NUL gen``                         :class:`Generation`
``marks``  ``name NUL {a: app_id, b: batch_id}``   the version that batch committed;
           ``name NUL {j: job_id}``                 the version that job committed
``checkpoints`` ``name NUL gen version``            :class:`Checkpoint` marker
``chunks`` ``name NUL gen version``, column ``i``   files ``i*K .. i*K+K-1`` of that
                                                    checkpoint, as one JSON array
``dropped`` ``location``                            a dropped table whose files vacuum
                                                    has yet to remove (``lifecycle``)
========== ======================================== ===============================

Why this layout:

* Every commit writes the head cell, so two commits of one table always conflict
  there (first committer wins) and nowhere else that a retry would not rewrite:
  the other rows it writes are keyed by the version it claims.
* The live files are the rows of the current *generation*. An overwrite starts a
  new generation instead of deleting rows, so it writes no tombstones, and
  listing the live files is one range scan whose length is the number of live
  files, however many commits came before.
* A row-level statement (``DELETE``, ``UPDATE``, ``MERGE``, ``REPLACE WHERE``,
  ``OPTIMIZE``) writes only what it changed, as Delta's remove actions do: a
  *removal row* (column ``r``) per file it rewrote and a file row per file it
  wrote, in the current generation. Removal rows are bounded: when a generation's
  removal rows would outnumber its live files (``Generation.removed``), the
  statement starts a new generation instead, holding the files it kept and those
  it wrote (a row per live file, paid for by the removals before it), so listing
  reads at most about three rows per live file. Tables written before removal
  rows existed have none: absent removal rows mean nothing was removed.
* Within a generation rows sort by the version that wrote them: the live files of
  version ``N`` are the rows of ``N``'s generation below ``N + 1`` added (column
  ``f``) and not removed by a later removal row below ``N + 1``, one range scan
  again (time travel).
* Every ``CHECKPOINT_INTERVAL`` versions (every ``EARLY_CHECKPOINT_INTERVAL`` in a
  generation's first ``EARLY_VERSIONS``) a checkpoint packs the generation's
  files so far into a few large cells (Delta's checkpoint, in cells). Listing
  version ``N`` reads the newest checkpoint at or below ``N`` plus the rows added
  after it: a handful of cells and at most one interval of rows, so the per-file
  cost is a JSON array element, not a cell. Checkpoints are derived, immutable
  and written after the commit, by whoever committed the version; a missing one
  only makes listing scan more rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, TypeVar

E = TypeVar("E")

#: Table names: usable as a percolake row and as a directory name.
TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
#: Catalog names: the prefix of the percolake tables holding the metadata.
CATALOG_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")

#: Operations recorded in the log (the names Delta Lake uses in its history).
CREATE = "CREATE TABLE"
APPEND = "WRITE"
OVERWRITE = "OVERWRITE"
DELETE = "DELETE"
UPDATE = "UPDATE"
MERGE = "MERGE"
#: An overwrite of the rows matching a predicate (``replaceWhere``) or of the
#: partitions the new rows fall in (dynamic partition overwrite).
REPLACE_WHERE = "REPLACE WHERE"
#: Compaction (``Lakehouse.optimize``): small files rewritten into fewer, no row
#: changed. It commits as a row-level statement does, but only a concurrent commit
#: that removed one of the files it rewrote conflicts with it (``read_set``).
OPTIMIZE = "OPTIMIZE"
#: Row-level statements, and compaction: each commits the live files at the head
#: minus those it rewrote plus those it wrote (removal rows and file rows, or a new
#: generation once removals would outnumber live files), checked against its read
#: set (``read_set``). Of these, only compaction changes no data.
DML_OPERATIONS = frozenset({DELETE, UPDATE, MERGE, REPLACE_WHERE, OPTIMIZE})
#: A schema change without data (``Lakehouse.add_columns``). Appends with
#: ``merge_schema`` and overwrites with ``overwrite_schema`` change the schema too,
#: under their own names; every schema change carries its new schema
#: (``CommitRequest.new_schema_json``).
ADD_COLUMNS = "ADD COLUMNS"

_SEP = b"\x00"
_U64 = 8
_U32 = 4


# --- what callers see ----------------------------------------------------------------

#: A statistic's value: JSON scalars only (a date is kept as its ISO string).
StatValue = int | str | bool


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """One column of one data file, from its Parquet footer (Delta's ``stats``).

    ``null_count`` is ``None`` when a row group did not record it; ``min_value`` and
    ``max_value`` are ``None`` when unknown: a row group with values but no
    statistics, only nulls, or a type not kept. Only integers, booleans, dates (as
    ISO strings) and strings of at most ``_stats.MAX_STAT_CHARS`` characters are:
    float statistics leave NaN out, so they could not bound a filter.
    """

    null_count: int | None
    min_value: StatValue | None = None
    max_value: StatValue | None = None

    def to_json(self) -> list[Any]:
        return [self.null_count, self.min_value, self.max_value]

    @classmethod
    def from_json(cls, item: Any) -> ColumnStats:
        nulls, low, high = item
        return cls(nulls, low, high)


#: Per-column statistics of one file, by column name.
FileStats = dict[str, ColumnStats]


@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file of a table version. ``path`` is absolute.

    ``partition`` maps each partition column to its value as written in the
    file's path (``None`` for a null value), the way Delta's ``partitionValues`` do.
    ``stats`` are the data columns' statistics when the writer recorded them (the
    ``percolake`` data source does), else ``None``.
    """

    path: str
    size_bytes: int
    record_count: int
    partition: dict[str, str | None] = field(default_factory=dict)
    stats: FileStats | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """One entry of a table's history: what a version added and removed.

    ``commit_ts`` is the percolake commit timestamp of the transaction that made
    the version: recorded after that transaction commits, or found in the
    transactions table or, once garbage collection deleted the entry, in the log
    record's commit stamp. It is ``None`` only for a catalog over a remote manager
    whose record failed (``Lakehouse(..., gateway_catalog=False)``).
    ``timestamp_ms`` is the version's log time: the committer's wall clock, raised
    where needed so that it never decreases from one version to the next and lies
    above every time a ``version_at`` answered before the version committed
    (``Catalog.version_at``); retention is measured against it.
    """

    version: int
    commit_ts: int | None
    operation: str
    added_files: tuple[str, ...]
    removed_files: tuple[str, ...]
    app_id: str | None
    batch_id: int | str | None
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class DmlResult:
    """What a row-level statement did (the metrics of deltalake's DML calls).

    ``version`` is the version it committed, or the version it read when it changed
    nothing: like deltalake, a statement that matches no row commits no version.
    """

    version: int
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    files_added: int = 0
    files_removed: int = 0


# --- what the cells hold -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableMeta:
    """The table's identity and schema; only a schema change rewrites it.

    ``schema_json`` is the schema from version ``schema_since`` on; ``earlier_schemas``
    holds the schemas before it as ``(since_version, schema_json)``, oldest first, so
    that time travel reads an old version with the schema it was written under.
    """

    name: str
    schema_json: str  # Spark's StructType.json(); opaque to the metadata layer
    partition_by: tuple[str, ...]
    location: str
    created_ms: int
    schema_since: int = 0
    earlier_schemas: tuple[tuple[int, str], ...] = ()

    def schema_at(self, version: int) -> str:
        """The schema that version ``version`` was read with when it was the latest."""
        if version >= self.schema_since:
            return self.schema_json
        found = self.earlier_schemas[0][1] if self.earlier_schemas else self.schema_json
        for since, schema in self.earlier_schemas:
            if since <= version:
                found = schema
        return found

    def with_schema(self, schema_json: str, version: int) -> TableMeta:
        """This table with ``schema_json`` from ``version`` on (the old one kept)."""
        earlier = (*self.earlier_schemas, (self.schema_since, self.schema_json))
        return TableMeta(
            self.name,
            schema_json,
            self.partition_by,
            self.location,
            self.created_ms,
            version,
            earlier,
        )

    def encode(self) -> bytes:
        d: dict[str, Any] = {
            "name": self.name,
            "schema": self.schema_json,
            "partition_by": list(self.partition_by),
            "location": self.location,
            "created_ms": self.created_ms,
        }
        if self.schema_since:
            d["since"] = self.schema_since
            d["earlier"] = [list(e) for e in self.earlier_schemas]
        return _dump(d)

    @classmethod
    def decode(cls, raw: bytes) -> TableMeta:
        d = _load(raw)
        return cls(
            name=str(d["name"]),
            schema_json=str(d["schema"]),
            partition_by=tuple(str(c) for c in d["partition_by"]),
            location=str(d["location"]),
            created_ms=int(d["created_ms"]),
            schema_since=int(d.get("since", 0)),
            earlier_schemas=tuple((int(v), str(j)) for v, j in d.get("earlier", ())),
        )


@dataclass(frozen=True, slots=True)
class Head:
    """The table's current state; written by every commit and by vacuum.

    ``vacuum_cutoff_ms``: the latest cutoff of a vacuum; files of a job that
    started before it may have been removed, so such a job must not commit.
    ``min_readable_version``: versions below it are no longer readable: vacuum
    removed their files, or retention expired them (see ``retention``).
    ``schema_version``: the version that set the current schema (0: creation);
    ``schema_break``: the latest version whose schema change made files written
    under the schema before it unreadable (an overwrite's new schema), 0 if none.
    ``last_ms``: the lowest log time the next commit may take: the latest commit's,
    or above a time that ``version_at`` answered for since (it raises it, so the
    answer stays true). Log times never go backwards even when a committer's
    clock does, which retention and time travel rely on.
    """

    version: int
    gen: int
    gen_start: int
    last_ms: int
    vacuum_cutoff_ms: int = 0
    min_readable_version: int = 0
    schema_version: int = 0
    schema_break: int = 0
    #: ``TableMeta.created_ms`` of the table this head belongs to (0 in heads written
    #: before tables could be dropped): cached metadata of a dropped table of the
    #: same name is told apart by it.
    created_ms: int = 0

    def encode(self) -> bytes:
        d = {
            "v": self.version,
            "g": self.gen,
            "gs": self.gen_start,
            "ms": self.last_ms,
            "vc": self.vacuum_cutoff_ms,
            "mr": self.min_readable_version,
        }
        if self.schema_version:  # absent in heads of tables whose schema never changed
            d["sv"] = self.schema_version
            d["sb"] = self.schema_break
        if self.created_ms:
            d["cr"] = self.created_ms
        return _dump(d)

    @classmethod
    def decode(cls, raw: bytes) -> Head:
        d = _load(raw)
        return cls(
            int(d["v"]),
            int(d["g"]),
            int(d["gs"]),
            int(d["ms"]),
            int(d["vc"]),
            int(d["mr"]),
            int(d.get("sv", 0)),
            int(d.get("sb", 0)),
            int(d.get("cr", 0)),
        )


@dataclass(frozen=True, slots=True)
class LogRecord:
    """The commit record of one version (``Commit`` without the file lists).

    ``timestamp_ms`` is the version's log time (see :class:`Commit`); it is taken
    when the commit attempt reads the head, before its commit point, and the head
    conflict orders it: an attempt whose head went stale retries with a new one.
    ``changes``: the change files of a row-level statement (its changed rows with
    their ``_change_type``, for the change data feed); kept in the record so that
    they commit with the version and are never listed as the table's files.
    """

    version: int
    operation: str
    timestamp_ms: int
    gen: int
    added_count: int
    job_id: str | None
    app_id: str | None
    batch_id: int | str | None
    txn_start_ts: int
    changes: tuple[FileEntry, ...] = ()

    def encode(self) -> bytes:
        d: dict[str, Any] = {
            "v": self.version,
            "op": self.operation,
            "ms": self.timestamp_ms,
            "g": self.gen,
            "n": self.added_count,
            "job": self.job_id,
            "app": self.app_id,
            "batch": self.batch_id,
            "tx": self.txn_start_ts,
        }
        if self.changes:  # absent in the records of every other version
            d["cd"] = [e.to_dict() for e in self.changes]
        return _dump(d)

    @classmethod
    def decode(cls, raw: bytes) -> LogRecord:
        d = _load(raw)
        batch = d["batch"]
        return cls(
            version=int(d["v"]),
            operation=str(d["op"]),
            timestamp_ms=int(d["ms"]),
            gen=int(d["g"]),
            added_count=int(d["n"]),
            job_id=None if d["job"] is None else str(d["job"]),
            app_id=None if d["app"] is None else str(d["app"]),
            batch_id=batch if isinstance(batch, int | str) else None,
            txn_start_ts=int(d["tx"]),
            changes=tuple(_entry_from_dict(item, FileEntry) for item in d.get("cd", ())),
        )


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A data file as recorded: ``path`` relative to the table location.

    ``stats`` is optional everywhere it is stored (the file row's ``st``, a fifth
    element in checkpoint chunks, ``stats_json`` on the wire): records written before
    statistics existed, or by writers that do not collect them, read as ``None``.
    """

    path: str
    size_bytes: int
    record_count: int
    partition: dict[str, str | None] = field(default_factory=dict)
    stats: FileStats | None = None

    def encode(self) -> bytes:
        return _dump(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"p": self.path, "s": self.size_bytes, "n": self.record_count}
        if self.partition:
            d["pv"] = self.partition
        if self.stats:
            d["st"] = stats_to_json(self.stats)
        return d

    @classmethod
    def decode(cls, raw: bytes) -> FileEntry:
        return decode_file(raw, cls)


def stats_to_json(stats: FileStats) -> dict[str, list[Any]]:
    return {column: s.to_json() for column, s in stats.items()}


def stats_from_json(d: dict[str, Any] | None) -> FileStats | None:
    if not d:
        return None
    return {column: ColumnStats.from_json(item) for column, item in d.items()}


def encode_stats(stats: FileStats | None) -> str:
    """Statistics as one JSON string (the wire's ``stats_json``); ``""`` for none."""
    if not stats:
        return ""
    return json.dumps(stats_to_json(stats), separators=(",", ":"), ensure_ascii=False)


def decode_stats(text: str) -> FileStats | None:
    """Statistics from ``encode_stats``'s JSON, checked: ``ValueError`` if malformed."""
    if not text:
        return None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"file statistics are not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise ValueError("file statistics must be a JSON object of columns")
    out: FileStats = {}
    for column, item in d.items():
        if not isinstance(item, list) or len(item) != 3:
            raise ValueError(f"statistics of column {column!r} must be [nulls, min, max]")
        nulls, low, high = item
        if nulls is not None and (isinstance(nulls, bool) or not isinstance(nulls, int)):
            raise ValueError(f"null count of column {column!r} must be an integer or null")
        for value in (low, high):
            if value is not None and not isinstance(value, int | str):  # bool is an int
                raise ValueError(f"min/max of column {column!r} must be JSON scalars")
        out[column] = ColumnStats(nulls, low, high)
    return out or None


def encode_chunk(entries: Sequence[FileEntry]) -> bytes:
    """Many entries in one cell: a JSON array of ``[path, size, records, partition]``,
    with the statistics as a fifth element when the file has them."""
    return json.dumps(
        [
            [e.path, e.size_bytes, e.record_count, e.partition or None, stats_to_json(e.stats)]
            if e.stats
            else [e.path, e.size_bytes, e.record_count, e.partition or None]
            for e in entries
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


#: Builds what a listing returns from ``(path, size_bytes, record_count, partition,
#: stats)``: a ``FileEntry``, or straight away the caller's public object (no second copy).
EntryFactory = Callable[[str, int, int, dict[str, str | None], FileStats | None], E]


def decode_chunk(
    raw: bytes, make: EntryFactory[E], skip: AbstractSet[str] = frozenset()
) -> list[E]:
    """The chunk's files, but those whose path is in ``skip`` (removed since)."""
    items = json.loads(raw)
    if not isinstance(items, list):
        raise ValueError(f"corrupt lakehouse checkpoint chunk: {raw[:80]!r}")
    if skip:
        items = [item for item in items if item[0] not in skip]
    # Hot path of listing (one call per live file): values are trusted, as written.
    # Chunks written before statistics existed have four elements per file.
    return [
        make(
            item[0],
            item[1],
            item[2],
            dict(item[3]) if item[3] else {},
            stats_from_json(item[4]) if len(item) > 4 else None,
        )
        for item in items
    ]


def decode_file(raw: bytes, make: EntryFactory[E]) -> E:
    """A file row's value, built by ``make``."""
    return _entry_from_dict(_load(raw), make)


def _entry_from_dict(d: dict[str, Any], make: EntryFactory[E]) -> E:
    return make(
        str(d["p"]),
        int(d["s"]),
        int(d["n"]),
        dict(d.get("pv", {})),
        stats_from_json(d.get("st")),
    )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Marker of a checkpoint: the generation's files up to ``version``, in ``chunks`` cells."""

    gen: int
    version: int
    files: int
    chunks: int

    def encode(self) -> bytes:
        return _dump({"g": self.gen, "v": self.version, "n": self.files, "k": self.chunks})

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint:
        d = _load(raw)
        return cls(int(d["g"]), int(d["v"]), int(d["n"]), int(d["k"]))


@dataclass(frozen=True, slots=True)
class Generation:
    """A run of versions listed from one range of file rows; an overwrite starts the
    next one, and so does a row-level statement once ``removed`` would outnumber the
    live files.

    ``removed``: the removal rows written in this generation so far (absent in
    generations written before removal rows existed, which have none).
    """

    gen: int
    start_version: int
    started_ms: int
    removed: int = 0

    def encode(self) -> bytes:
        d = {"g": self.gen, "v": self.start_version, "ms": self.started_ms}
        if self.removed:
            d["rm"] = self.removed
        return _dump(d)

    @classmethod
    def decode(cls, raw: bytes) -> Generation:
        d = _load(raw)
        return cls(int(d["g"]), int(d["v"]), int(d["ms"]), int(d.get("rm", 0)))


def _dump(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()


def _load(raw: bytes) -> dict[str, Any]:
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ValueError(f"corrupt lakehouse metadata cell: {raw[:80]!r}")
    return d


# --- cell addresses ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    """The percolake tables and row keys of one catalog."""

    catalog: str

    COL_META = b"m"
    COL_HEAD = b"h"
    COL_RECORD = b"c"
    COL_COMMIT_TS = b"ts"
    COL_FILE = b"f"
    #: A removal row: the file (its whole entry) that the row's version removed.
    COL_REMOVE = b"r"
    #: Removal rows' indexes start here, after any version's added files.
    REMOVE_INDEX = 1 << 31
    COL_GEN = b"g"
    COL_MARK = b"v"
    COL_CHECKPOINT = b"m"
    COL_DROPPED = b"d"

    @staticmethod
    def chunk_column(index: int) -> bytes:
        return b"%06d" % index

    @property
    def tables(self) -> str:
        return f"{self.catalog}.tables"

    @property
    def head(self) -> str:
        return f"{self.catalog}.head"

    @property
    def log(self) -> str:
        return f"{self.catalog}.log"

    @property
    def files(self) -> str:
        return f"{self.catalog}.files"

    @property
    def gens(self) -> str:
        return f"{self.catalog}.gens"

    @property
    def marks(self) -> str:
        return f"{self.catalog}.marks"

    @property
    def checkpoints(self) -> str:
        return f"{self.catalog}.checkpoints"

    @property
    def chunks(self) -> str:
        return f"{self.catalog}.chunks"

    @property
    def dropped(self) -> str:
        """Dropped tables' files awaiting vacuum, keyed by location (``lifecycle``)."""
        return f"{self.catalog}.dropped"

    @staticmethod
    def dropped_row(location: str) -> bytes:
        return location.encode()

    @staticmethod
    def name_row(name: str) -> bytes:
        return name.encode()

    @staticmethod
    def prefix(name: str) -> bytes:
        return name.encode() + _SEP

    @staticmethod
    def prefix_end(name: str) -> bytes:
        """The first row after every row that starts with ``prefix(name)``."""
        return name.encode() + b"\x01"

    @classmethod
    def log_row(cls, name: str, version: int) -> bytes:
        return cls.prefix(name) + version.to_bytes(_U64, "big")

    @classmethod
    def version_of_log_row(cls, name: str, row: bytes) -> int:
        return int.from_bytes(row[len(cls.prefix(name)) :], "big")

    @classmethod
    def gen_row(cls, name: str, gen: int) -> bytes:
        return cls.prefix(name) + gen.to_bytes(_U64, "big")

    @classmethod
    def file_row(cls, name: str, gen: int, version: int, index: int) -> bytes:
        return (
            cls.prefix(name)
            + gen.to_bytes(_U64, "big")
            + version.to_bytes(_U64, "big")
            + index.to_bytes(_U32, "big")
        )

    @classmethod
    def removal_row(cls, name: str, gen: int, version: int, index: int) -> bytes:
        """The ``index``-th removal row of ``version`` (column ``COL_REMOVE``)."""
        return cls.file_row(name, gen, version, cls.REMOVE_INDEX + index)

    @classmethod
    def file_range(
        cls, name: str, gen: int, *, from_version: int = 0, below_version: int | None = None
    ) -> tuple[bytes, bytes]:
        """Rows of generation ``gen`` added by versions in ``[from_version, below_version)``."""
        start = cls.prefix(name) + gen.to_bytes(_U64, "big")
        end = (
            cls.prefix(name) + (gen + 1).to_bytes(_U64, "big")
            if below_version is None
            else start + below_version.to_bytes(_U64, "big")
        )
        if from_version:
            start += from_version.to_bytes(_U64, "big")
        return start, end

    @classmethod
    def checkpoint_row(cls, name: str, gen: int, version: int) -> bytes:
        return cls.prefix(name) + gen.to_bytes(_U64, "big") + version.to_bytes(_U64, "big")

    @classmethod
    def files_from_gen(cls, name: str, gen: int) -> tuple[bytes, bytes]:
        """Rows of generation ``gen`` and every later one."""
        return cls.prefix(name) + gen.to_bytes(_U64, "big"), cls.prefix_end(name)

    @classmethod
    def parse_file_row(cls, name: str, row: bytes) -> tuple[int, int, int]:
        """``(gen, version, index)`` of a file row."""
        rest = row[len(cls.prefix(name)) :]
        return (
            int.from_bytes(rest[:_U64], "big"),
            int.from_bytes(rest[_U64 : 2 * _U64], "big"),
            int.from_bytes(rest[2 * _U64 :], "big"),
        )

    @classmethod
    def mark_row(cls, name: str, app_id: str, batch_id: int | str) -> bytes:
        return cls.prefix(name) + _dump({"a": app_id, "b": batch_id})

    @classmethod
    def job_mark_row(cls, name: str, job_id: str) -> bytes:
        """The mark of a job's commit, so that sending it again cannot commit it twice."""
        return cls.prefix(name) + _dump({"j": job_id})
