"""The change data feed: the rows each version inserted, deleted or updated, as Delta gives them.

``Lakehouse.changes`` and the data source's ``readChangeFeed`` option read it. Every
row carries the table's columns plus ``_change_type`` (``insert``, ``delete``,
``update_preimage``, ``update_postimage``), ``_commit_version`` and
``_commit_timestamp`` (the version's log time). How each kind of version is read
(:func:`plan_changes`):

* an append (``WRITE``): every row of the files it added is an ``insert``;
* an overwrite, ``replaceWhere`` or dynamic partition overwrite (``OVERWRITE``,
  ``REPLACE WHERE``): every row of the files it removed is a ``delete``, every row of
  the files it added an ``insert``;
* ``DELETE``, ``UPDATE`` and ``MERGE`` rewrite whole files (copy-on-write), so their
  added and removed files cannot tell which rows changed. Each one writes its changed
  rows, with their ``_change_type``, as *change files* beside its data files
  (``part-cdc-*`` in its job folder, :func:`write_change_files`) and commits them in
  its log record (``LogRecord.changes``): they appear with the version, atomically,
  plain reads never list them, and vacuum keeps them as long as the version is
  readable. The feed of such a version is exactly those rows: the rows a ``DELETE``
  deleted (not the survivors it copied), the pre- and post-image of every row an
  ``UPDATE`` or ``MERGE`` changed, and the rows a ``MERGE`` inserted or deleted;
* compaction (``OPTIMIZE``), schema changes and table creation change no row: nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_integration.engine.errors import VersionNotFoundError
from spark_integration.engine.model import (
    APPEND,
    DELETE,
    MERGE,
    OVERWRITE,
    REPLACE_WHERE,
    UPDATE,
    FileEntry,
    TableMeta,
)
from spark_integration.spark.hook import Job, write_files
from spark_integration.spark.reads import read_version
from spark_integration.spark.schema import quote, without_nullability
from spark_integration.spark.schema_change import widens

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from spark_integration.engine.catalog import Catalog
    from spark_integration.service.client import RemoteCatalog

log = logging.getLogger(__name__)

#: The columns the feed adds to the table's (Delta's names).
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
FEED_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)

#: The values of ``_change_type``.
INSERT = "insert"
DELETE_ROW = "delete"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"

#: Versions whose added and removed files are their changes.
_BY_FILES = frozenset({APPEND, OVERWRITE, REPLACE_WHERE})
#: Versions that record their changes in change files (copy-on-write DML).
_BY_CHANGE_FILES = frozenset({DELETE, UPDATE, MERGE})
#: The file-name tag of change files in a DML job's folder.
CHANGE_FILE_TAG = "cdc-"


@dataclass(frozen=True, slots=True)
class ChangePiece:
    """Files whose every row is one change of one version.

    ``change_type`` is the change of every row, or ``None`` for change files, whose
    rows carry their own ``_change_type`` column.
    """

    version: int
    timestamp_ms: int
    change_type: str | None
    files: tuple[FileEntry, ...]


@dataclass(frozen=True, slots=True)
class ChangePlan:
    """What to read for the changes of versions ``start..end`` of a table."""

    meta: TableMeta
    start: int
    end: int
    pieces: tuple[ChangePiece, ...]

    @property
    def schema(self) -> StructType:
        """The table's columns as of ``end`` (every version is read with them)."""
        return StructType.fromJson(json.loads(self.meta.schema_at(self.end)))


def feed_schema(schema: StructType) -> StructType:
    """The table's columns plus the feed's three."""
    return StructType(
        [
            *schema.fields,
            StructField(CHANGE_TYPE, StringType(), False),
            StructField(COMMIT_VERSION, LongType(), False),
            StructField(COMMIT_TIMESTAMP, TimestampType(), False),
        ]
    )


def change_file_schema(schema: StructType) -> StructType:
    """The columns of a change file: the table's plus ``_change_type``."""
    return StructType([*schema.fields, StructField(CHANGE_TYPE, StringType(), False)])


def write_change_files(
    rows: DataFrame, schema: StructType, partition_by: tuple[str, ...], job: Job
) -> list[FileEntry]:
    """A DML job's changed rows (table columns plus ``_change_type``) written as change
    files into its own job folder, partitioned like its data files."""
    return write_files(rows, change_file_schema(schema), partition_by, job, tag=CHANGE_FILE_TAG)


def tagged(rows: DataFrame, schema: StructType, change_type: str) -> DataFrame:
    """``rows`` (the table's columns) with ``_change_type`` set to ``change_type``."""
    columns = [quote(name) for name in schema.fieldNames()]
    return rows.selectExpr(*columns, f"'{change_type}' AS {CHANGE_TYPE}")


def check_versions(starting_version: object, ending_version: object) -> tuple[int, int | None]:
    """The feed's version arguments, checked (``None``: up to the latest)."""
    start = _version("starting_version", starting_version)
    end = None if ending_version is None else _version("ending_version", ending_version)
    if end is not None and end < start:
        raise ValueError(f"ending_version {end} is before starting_version {start}")
    return start, end


def _version(label: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{label} must not be negative, got {value}")
    return value


def plan_changes(
    catalog: Catalog | RemoteCatalog, name: str, start: int, end: int | None
) -> ChangePlan:
    """The files holding the changes of versions ``start..end`` (``None``: the latest).

    An ``end`` past the latest version reads up to the latest, as Delta does. Raises
    :class:`VersionNotFoundError` for a ``start`` after the latest version or one that
    retention expired or vacuum made unreadable, ``TableNotFoundError`` for no table.
    """
    prepared = catalog.prepare(name)
    head = prepared.head
    if start > head.version:
        raise VersionNotFoundError(
            f"change feed of table {name!r}: starting version {start} is after the "
            f"latest version {head.version}"
        )
    last = head.version if end is None else min(end, head.version)
    # Only the range's log records and file rows: a feed of the last few versions of
    # a long-lived table reads as much as those versions wrote.
    entries = catalog.history(name, from_version=start, to_version=last)
    history = {h.record.version: h for h in entries}
    if start < head.min_readable_version or start not in history:
        raise VersionNotFoundError(
            f"change feed of table {name!r}: version {start} is no longer readable "
            f"(expired by the table's retention or vacuumed; the oldest readable version "
            f"is {max(head.min_readable_version, min(history, default=head.version))})"
        )
    pieces: list[ChangePiece] = []
    for version in range(start, last + 1):
        h = history.get(version)
        if h is None:
            continue
        record = h.record
        ms = record.timestamp_ms
        if record.operation in _BY_CHANGE_FILES and record.changes:
            pieces.append(ChangePiece(version, ms, None, record.changes))
        elif record.operation in _BY_FILES or record.operation in _BY_CHANGE_FILES:
            # A DML version written before change files existed: as an overwrite.
            if h.removed:
                pieces.append(ChangePiece(version, ms, DELETE_ROW, tuple(h.removed)))
            if h.added:
                pieces.append(ChangePiece(version, ms, INSERT, tuple(h.added)))
    log.debug("change feed of %s, versions %d..%d: %d pieces", name, start, last, len(pieces))
    plan = ChangePlan(prepared.meta, start, last, tuple(pieces))
    _check_read_schema(name, prepared.meta, start, last)
    clashes = [c for c in plan.schema.fieldNames() if c.lower() in FEED_COLUMNS]
    if clashes:
        raise ValueError(
            f"change feed of table {name!r}: its column {clashes[0]!r} clashes with the "
            "change feed's own column of that name"
        )
    return plan


def _check_read_schema(name: str, meta: TableMeta, start: int, last: int) -> None:
    """Refuse a range whose files cannot all be read with the schema of ``last``.

    Every file the feed of ``start..last`` reads was written under a schema in effect
    from version ``start - 1`` (the files ``start`` removed) to ``last``, or under an
    older one that differs from those only by added columns and safe widening (an
    ``overwrite_schema`` removes every file written before it). Columns a file lacks
    read as NULL and columns ``last`` lacks are left out, but a column whose type an
    ``overwrite_schema`` changed other than by widening cannot be read from the older
    files: Delta refuses such a range too, before reading anything.
    """
    read = StructType.fromJson(json.loads(meta.schema_at(last)))
    want = {f.name: without_nullability(f.dataType) for f in read.fields}
    changes_at = {since for since, _ in meta.earlier_schemas} | {meta.schema_since}
    first = max(start - 1, 0)
    for since in sorted({first} | {v for v in changes_at if first < v <= last}):
        for f in StructType.fromJson(json.loads(meta.schema_at(since))).fields:
            new = want.get(f.name)
            old = without_nullability(f.dataType)
            if new is None or old == new or widens(old, new):
                continue
            raise ValueError(
                f"change feed of table {name!r}: versions {start}..{last} cannot be read "
                f"with the schema of version {last}: column {f.name!r} is "
                f"{f.dataType.simpleString()} in the schema of version {since} and "
                f"{read[f.name].dataType.simpleString()} in that of version {last} (an "
                "overwrite_schema changed its type); read the changes before and after "
                "that overwrite separately"
            )


def changes(
    catalog: Catalog | RemoteCatalog,
    spark: SparkSession | ConnectSession,
    name: str,
    starting_version: object,
    ending_version: object,
) -> DataFrame:
    """``Lakehouse.changes``: the change rows of versions ``starting_version`` to
    ``ending_version`` (``None``: the latest) as one DataFrame, oldest version first."""
    start, end = check_versions(starting_version, ending_version)
    plan = plan_changes(catalog, name, start, end)
    schema = plan.schema
    parts = [_piece_rows(spark, plan.meta, schema, piece) for piece in plan.pieces]
    if not parts:
        return spark.createDataFrame([], feed_schema(schema))
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def _piece_rows(
    spark: SparkSession | ConnectSession, meta: TableMeta, schema: StructType, piece: ChangePiece
) -> DataFrame:
    """One piece's rows with the feed's columns."""
    columns: Sequence[str] = [quote(n) for n in schema.fieldNames()]
    if piece.change_type is None:
        read_schema = change_file_schema(schema)
        change = CHANGE_TYPE
    else:
        read_schema = schema
        change = f"'{piece.change_type}'"
    rows = read_version(spark, read_schema, meta.partition_by, meta.location, piece.files)
    return rows.selectExpr(
        *columns,
        f"{change} AS {CHANGE_TYPE}",
        f"CAST({piece.version} AS BIGINT) AS {COMMIT_VERSION}",
        f"timestamp_millis(CAST({piece.timestamp_ms} AS BIGINT)) AS {COMMIT_TIMESTAMP}",
    )
