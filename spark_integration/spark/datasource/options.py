"""The options of the ``percolake`` Spark data source, checked before any task runs.

Spark hands a Python data source its options as strings in a case-insensitive map
(keys arrive lower-cased); ``path`` is the table name given to ``load``/``save``.
Each direction accepts its own options and refuses the other's by name, so that a
``versionAsOf`` on a write or a ``txnVersion`` on a read never passes silently.
Option names are those of docs/lakehouse.md ("The Spark data source").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from spark_integration.engine.locations import join, normalize_location
from spark_integration.engine.model import TABLE_NAME
from spark_integration.spark import filesystem

DEFAULT_GATEWAY = "127.0.0.1:7070"

#: Options every direction takes, and the ones Spark itself adds.
_COMMON = {"path", "gateway"}
_READ = {"versionasof", "timestampasof"}
_WRITE = {"warehouse", "txnappid", "txnversion", "createifmissing", "partitioncolumns"}
#: A batch write's only: Spark's DataFrameWriter option, checked against overwrites.
_BATCH_WRITE = {
    *_WRITE,
    "partitionoverwritemode",
    "replacewhere",
    "mergeschema",
    "overwriteschema",
}
#: Spark passes a streaming query's checkpoint to its sink; it also names the query.
_STREAM_WRITE = {*_WRITE, "checkpointlocation", "queryname"}
_STREAM_READ = {"startingversion", "maxfilespertrigger", "skipchangecommits"}
#: A change data feed read's (``startingVersion`` also starts a streaming read;
#: ``maxFilesPerTrigger`` is a streaming feed's only).
_CHANGE_FEED = {"readchangefeed", "startingversion", "endingversion", "maxfilespertrigger"}
#: Keys (lower-case) that only a streaming read takes.
STREAM_READ_OPTIONS = frozenset(_STREAM_READ)

#: The spelling users see in messages (Spark lower-cases keys on the way in).
_SPELLING = {
    "path": "path",
    "gateway": "gateway",
    "versionasof": "versionAsOf",
    "timestampasof": "timestampAsOf",
    "warehouse": "warehouse",
    "txnappid": "txnAppId",
    "txnversion": "txnVersion",
    "createifmissing": "createIfMissing",
    "partitioncolumns": "partitionColumns",
    "partitionoverwritemode": "partitionOverwriteMode",
    "replacewhere": "replaceWhere",
    "mergeschema": "mergeSchema",
    "overwriteschema": "overwriteSchema",
    "checkpointlocation": "checkpointLocation",
    "queryname": "queryName",
    "startingversion": "startingVersion",
    "maxfilespertrigger": "maxFilesPerTrigger",
    "skipchangecommits": "skipChangeCommits",
    "readchangefeed": "readChangeFeed",
    "endingversion": "endingVersion",
}

_ADDRESS = re.compile(r"[^\s,:]+:\d{1,5}")


@dataclass(frozen=True, slots=True)
class ReadOptions:
    table: str
    gateway: str
    version: int | None
    timestamp_ms: int | None


@dataclass(frozen=True, slots=True)
class ChangeFeedOptions:
    """``readChangeFeed``: the changes of versions ``starting_version`` to
    ``ending_version`` (``None``: the latest), as ``Lakehouse.changes`` gives them."""

    table: str
    gateway: str
    starting_version: int
    ending_version: int | None
    #: A streaming feed's ``maxFilesPerTrigger`` (``None``: every available file in
    #: each micro-batch); a batch read refuses it.
    max_files: int | None = None


@dataclass(frozen=True, slots=True)
class WriteOptions:
    table: str
    gateway: str
    warehouse: str | None
    app_id: str | None
    batch_id: int | None
    create_if_missing: bool
    #: ``None`` when the option is absent: the table's own partition columns apply.
    partition_by: tuple[str, ...] | None
    #: ``partitionOverwriteMode`` (``static`` or ``dynamic``); ``None`` when absent: the
    #: session's ``spark.sql.sources.partitionOverwriteMode`` applies.
    partition_overwrite_mode: str | None = None
    #: ``replaceWhere``: an overwrite replaces only the rows this predicate matches.
    replace_where: str | None = None
    #: ``mergeSchema``: add the DataFrame's new columns, widen (``schema_change``).
    merge_schema: bool = False
    #: ``overwriteSchema`` (overwrites only): the DataFrame's schema becomes the table's.
    overwrite_schema: bool = False


@dataclass(frozen=True, slots=True)
class StreamWriteOptions:
    table: str
    gateway: str
    warehouse: str | None
    #: ``txnAppId`` if given; else the query is named by its checkpoint (``app_id_for``).
    app_id: str | None
    checkpoint: str | None
    create_if_missing: bool
    partition_by: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class StreamReadOptions:
    table: str
    gateway: str
    #: ``None``: the table's latest version as a snapshot first, then the versions after it
    #: (Delta's default); with ``only_new`` (``startingVersion=latest``) only the versions after it.
    starting_version: int | None
    only_new: bool
    #: ``None``: every available file in each micro-batch.
    max_files: int | None
    skip_change_commits: bool


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def _check_known(options: Mapping[str, str], allowed: set[str], what: str) -> None:
    unknown = sorted(set(options) - allowed)
    if not unknown:
        return
    shown = [_SPELLING.get(k, k) for k in unknown]
    elsewhere = {
        "versionasof": "reads",
        "timestampasof": "reads",
        "txnversion": "batch writes",
        "partitionoverwritemode": "batch writes",
        "replacewhere": "batch writes",
        "mergeschema": "batch writes",
        "overwriteschema": "batch writes",
        **dict.fromkeys(_WRITE - {"txnversion"}, "writes"),
        **dict.fromkeys(_STREAM_READ, "streaming reads"),
        "readchangefeed": "change feed reads",
        "endingversion": "change feed reads",
    }
    hints = [f"{_SPELLING.get(k, k)} is for {elsewhere[k]}" for k in unknown if k in elsewhere]
    known = ", ".join(sorted(_SPELLING[k] for k in allowed if k != "path"))
    raise ValueError(
        f"percolake {what}: unknown option(s) {shown}"
        + (f" ({'; '.join(hints)})" if hints else "")
        + f"; the options are: {known}"
    )


def _table(options: Mapping[str, str]) -> str:
    name = options.get("path")
    if not name:
        raise ValueError(
            "percolake: no table given: pass the table name to load()/save()/start(), e.g. "
            'save("events")'
        )
    if not TABLE_NAME.fullmatch(name):
        raise ValueError(
            f"percolake: invalid table name {name!r}: the path is a table name (1-128 "
            "characters from [A-Za-z0-9_.-]), not a file system path"
        )
    return name


def _gateway(options: Mapping[str, str]) -> str:
    value = options.get("gateway", DEFAULT_GATEWAY).strip()
    addresses = [a.strip() for a in value.split(",")]
    if not value or not all(_ADDRESS.fullmatch(a) for a in addresses):
        raise ValueError(
            f"percolake: option gateway must be HOST:PORT[,HOST:PORT...], got {value!r}"
        )
    return ",".join(addresses)


def _bool(options: Mapping[str, str], key: str) -> bool:
    raw = options.get(key)
    if raw is None:
        return False
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"percolake: option {_SPELLING[key]} must be true or false, got {raw!r}")
    return lowered == "true"


def _non_negative_int(options: Mapping[str, str], key: str) -> int | None:
    raw = options.get(key)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit():
        raise ValueError(
            f"percolake: option {_SPELLING[key]} must be a non-negative integer, got {raw!r}"
        )
    return int(text)


def _warehouse(options: Mapping[str, str]) -> str | None:
    raw = options.get("warehouse")
    if raw is None:
        return None
    return normalize_location(raw, "percolake: option warehouse")


def _partition_by(options: Mapping[str, str]) -> tuple[str, ...] | None:
    raw = options.get("partitioncolumns")
    if raw is None:
        return None
    columns = tuple(c.strip() for c in raw.split(",") if c.strip())
    if raw.strip() and not columns:
        raise ValueError(f"percolake: option partitionColumns lists no column: {raw!r}")
    return columns


def _app_id(options: Mapping[str, str]) -> str | None:
    raw = options.get("txnappid")
    if raw is None:
        return None
    if not raw.strip():
        raise ValueError("percolake: option txnAppId must not be empty")
    return raw


def _create(options: Mapping[str, str], warehouse: str | None) -> bool:
    create = _bool(options, "createifmissing")
    if create and warehouse is None:
        raise ValueError(
            "percolake: option createIfMissing needs option warehouse (an absolute folder "
            "or s3://bucket/prefix, under which the new table's files go)"
        )
    return create


def parse_timestamp_ms(raw: str) -> int:
    """Milliseconds since the epoch from an ISO-8601 string; no offset means UTC.

    A Python data source cannot see the session time zone, so a naive timestamp is
    read as UTC (the time zone of the log's ``timestamp_ms``), never as local time.
    """
    text = raw.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise ValueError(
            f"percolake: option timestampAsOf must be an ISO-8601 timestamp such as "
            f"'2024-05-01T12:00:00Z' or '2024-05-01 12:00:00' (UTC), got {raw!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def read_options(options: Mapping[str, str]) -> ReadOptions:
    opts = _lower(options)
    if opts.get("readchangefeed", "").strip().lower() == "false":
        del opts["readchangefeed"]  # Delta's spelling of a plain read
    _check_known(opts, _COMMON | _READ, "read")
    table, gateway = _table(opts), _gateway(opts)
    version = _non_negative_int(opts, "versionasof")
    raw_ts = opts.get("timestampasof")
    if version is not None and raw_ts is not None:
        raise ValueError("percolake: give versionAsOf or timestampAsOf, not both")
    timestamp_ms = None if raw_ts is None else parse_timestamp_ms(raw_ts)
    return ReadOptions(table, gateway, version, timestamp_ms)


def change_feed_options(options: Mapping[str, str]) -> ChangeFeedOptions | None:
    """The options of a ``readChangeFeed`` read; ``None`` when that option is absent
    or ``false`` (a plain read)."""
    opts = _lower(options)
    if not _bool(opts, "readchangefeed"):
        return None
    _check_known(opts, _COMMON | _CHANGE_FEED, "change feed read")
    table, gateway = _table(opts), _gateway(opts)
    start = _non_negative_int(opts, "startingversion")
    if start is None:
        raise ValueError(
            "percolake: readChangeFeed needs option startingVersion, the first version "
            "whose changes to read"
        )
    end = _non_negative_int(opts, "endingversion")
    if end is not None and end < start:
        raise ValueError(f"percolake: option endingVersion {end} is before startingVersion {start}")
    return ChangeFeedOptions(table, gateway, start, end, _max_files(opts))


def _max_files(options: Mapping[str, str]) -> int | None:
    max_files = _non_negative_int(options, "maxfilespertrigger")
    if max_files == 0:
        raise ValueError("percolake: option maxFilesPerTrigger must be at least 1, got 0")
    return max_files


#: The Spark setting (and, without the prefix, the write option) that asks an overwrite
#: to replace only the partitions the DataFrame writes.
PARTITION_OVERWRITE_CONF = "spark.sql.sources.partitionOverwriteMode"
PARTITION_OVERWRITE_MODES = ("static", "dynamic")


def _partition_overwrite_mode(options: Mapping[str, str]) -> str | None:
    raw = options.get("partitionoverwritemode")
    if raw is None:
        return None
    mode = raw.strip().lower()
    if mode not in PARTITION_OVERWRITE_MODES:
        raise ValueError(
            f"percolake: option partitionOverwriteMode must be static or dynamic, got {raw!r}"
        )
    return mode


def write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options)
    _check_known(opts, _COMMON | _BATCH_WRITE, "write")
    table, gateway, warehouse = _table(opts), _gateway(opts), _warehouse(opts)
    app_id, batch_id = _app_id(opts), _non_negative_int(opts, "txnversion")
    if (app_id is None) != (batch_id is None):
        raise ValueError(
            "percolake: options txnAppId and txnVersion go together: give both (an "
            "idempotent write) or neither"
        )
    mode, replace_where = _partition_overwrite_mode(opts), opts.get("replacewhere")
    if replace_where is not None and not replace_where.strip():
        raise ValueError("percolake: option replaceWhere is empty")
    if replace_where is not None and mode == "dynamic":
        raise ValueError(
            "percolake: give option replaceWhere or partitionOverwriteMode=dynamic, not both"
        )
    merge_schema, overwrite_schema = _bool(opts, "mergeschema"), _bool(opts, "overwriteschema")
    if merge_schema and overwrite_schema:
        raise ValueError("percolake: give option mergeSchema or overwriteSchema, not both")
    if overwrite_schema and (replace_where is not None or mode == "dynamic"):
        raise ValueError(
            "percolake: option overwriteSchema replaces the whole table: it cannot go with "
            "replaceWhere or partitionOverwriteMode=dynamic"
        )
    return WriteOptions(
        table,
        gateway,
        warehouse,
        app_id,
        batch_id,
        _create(opts, warehouse),
        _partition_by(opts),
        mode,
        replace_where,
        merge_schema,
        overwrite_schema,
    )


def stream_read_options(options: Mapping[str, str]) -> StreamReadOptions:
    opts = _lower(options)
    for key in ("versionasof", "timestampasof"):
        if key in opts:
            raise ValueError(
                f"percolake: option {_SPELLING[key]} is for batch reads; a streaming read "
                "starts at option startingVersion"
            )
    _check_known(opts, _COMMON | _STREAM_READ, "streaming read")
    table, gateway = _table(opts), _gateway(opts)
    raw_start = opts.get("startingversion")
    only_new = raw_start is not None and raw_start.strip().lower() == "latest"
    starting = None if only_new else _non_negative_int(opts, "startingversion")
    return StreamReadOptions(
        table, gateway, starting, only_new, _max_files(opts), _bool(opts, "skipchangecommits")
    )


def stream_write_options(options: Mapping[str, str]) -> StreamWriteOptions:
    opts = _lower(options)
    if "txnversion" in opts:
        raise ValueError(
            "percolake: option txnVersion is for batch writes; a streaming write's "
            "version is its micro-batch id"
        )
    _check_known(opts, _COMMON | _STREAM_WRITE, "streaming write")
    table, gateway, warehouse = _table(opts), _gateway(opts), _warehouse(opts)
    app_id, checkpoint = _app_id(opts), opts.get("checkpointlocation")
    if app_id is None and not checkpoint:
        raise ValueError(
            "percolake: a streaming write needs a checkpointLocation (it names the query "
            "whose micro-batches commit exactly once) or a txnAppId"
        )
    return StreamWriteOptions(
        table,
        gateway,
        warehouse,
        app_id,
        checkpoint,
        _create(opts, warehouse),
        _partition_by(opts),
    )


#: Spark writes the query id into ``<checkpoint>/metadata`` when the query first starts,
#: and a restart from the checkpoint keeps it: the stable name of the query.
CHECKPOINT_METADATA = "metadata"


def query_id_of_checkpoint(checkpoint: str) -> str:
    """The id of the streaming query that owns ``checkpoint``.

    The checkpoint is Spark's: a local path, a ``file:`` URI, or ``s3a://``/``s3://``
    when Spark keeps it on S3 (through hadoop-aws; the metadata file is then read here
    with the same AWS settings). Other schemes need ``txnAppId``.
    """
    folder = checkpoint[len("file:") :] if checkpoint.startswith("file:") else checkpoint
    try:
        location = normalize_location(folder, "percolake: checkpointLocation")
    except ValueError:
        raise ValueError(
            f"percolake: cannot read the query id from checkpoint {checkpoint!r} (not a "
            "local path or s3a:// URL); give option txnAppId to name the query"
        ) from None
    path = join(location, CHECKPOINT_METADATA)
    try:
        first = filesystem.read_bytes(path).decode("utf-8").split("\n", 1)[0]
        query_id = json.loads(first)["id"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"percolake: cannot read the query id from {path} ({exc}); give option "
            "txnAppId to name the query"
        ) from None
    if not isinstance(query_id, str) or not query_id:
        raise ValueError(f"percolake: no query id in {path}; give option txnAppId")
    return query_id
