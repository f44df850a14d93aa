"""The lakehouse metadata on the wire: model objects to ``lakehouse.proto`` messages and back.

Shared by the gateway's service (``spark_integration.service.servicer``) and its client
(``spark_integration.service.client``). Checks of what a client sends live in the service,
at the edge; decoding what the gateway sends trusts it.
"""

from __future__ import annotations

from collections.abc import Iterable

from spark_integration.engine.lifecycle import DroppedTable
from spark_integration.engine.model import (
    ADD_COLUMNS,
    APPEND,
    DELETE,
    MERGE,
    OPTIMIZE,
    OVERWRITE,
    REPLACE_WHERE,
    UPDATE,
    FileEntry,
    FileStats,
    Head,
    TableMeta,
    decode_stats,
    encode_stats,
)
from spark_integration.engine.read_set import ReadSet
from spark_integration.engine.retention import Retention
from wire.v1 import lakehouse_pb2 as pb

OPERATIONS = {
    APPEND: pb.COMMIT_OPERATION_APPEND,
    OVERWRITE: pb.COMMIT_OPERATION_OVERWRITE,
    DELETE: pb.COMMIT_OPERATION_DELETE,
    UPDATE: pb.COMMIT_OPERATION_UPDATE,
    MERGE: pb.COMMIT_OPERATION_MERGE,
    REPLACE_WHERE: pb.COMMIT_OPERATION_REPLACE_WHERE,
    ADD_COLUMNS: pb.COMMIT_OPERATION_ADD_COLUMNS,
    OPTIMIZE: pb.COMMIT_OPERATION_OPTIMIZE,
}
OPERATION_NAMES = {v: k for k, v in OPERATIONS.items()}


def meta_to_pb(meta: TableMeta) -> pb.TableMeta:
    return pb.TableMeta(
        name=meta.name,
        schema_json=meta.schema_json,
        partition_by=list(meta.partition_by),
        location=meta.location,
        created_ms=meta.created_ms,
        schema_since=meta.schema_since,
        earlier_schemas=[
            pb.SchemaAt(since_version=v, schema_json=j) for v, j in meta.earlier_schemas
        ],
    )


def meta_from_pb(msg: pb.TableMeta) -> TableMeta:
    return TableMeta(
        msg.name,
        msg.schema_json,
        tuple(msg.partition_by),
        msg.location,
        msg.created_ms,
        msg.schema_since,
        tuple((e.since_version, e.schema_json) for e in msg.earlier_schemas),
    )


def dropped_to_pb(d: DroppedTable) -> pb.DroppedTable:
    return pb.DroppedTable(name=d.name, location=d.location, dropped_ms=d.dropped_ms)


def dropped_from_pb(msg: pb.DroppedTable) -> DroppedTable:
    return DroppedTable(msg.name, msg.location, msg.dropped_ms)


def retention_to_pb(retention: Retention | None) -> pb.Retention | None:
    if retention is None:
        return None
    return pb.Retention(
        log_retention_s=retention.log_retention_s,
        mark_retention_s=retention.mark_retention_s,
    )


def retention_from_pb(msg: pb.Retention) -> Retention:
    """Raises ``ValueError`` naming the field for a negative, NaN or infinite value."""
    return Retention(msg.log_retention_s, msg.mark_retention_s)


def head_to_pb(head: Head) -> pb.Head:
    return pb.Head(
        version=head.version,
        gen=head.gen,
        gen_start=head.gen_start,
        last_ms=head.last_ms,
        vacuum_cutoff_ms=head.vacuum_cutoff_ms,
        min_readable_version=head.min_readable_version,
        schema_version=head.schema_version,
        schema_break=head.schema_break,
    )


def head_from_pb(msg: pb.Head) -> Head:
    return Head(
        msg.version,
        msg.gen,
        msg.gen_start,
        msg.last_ms,
        msg.vacuum_cutoff_ms,
        msg.min_readable_version,
        msg.schema_version,
        msg.schema_break,
    )


def file_to_pb(
    path: str,
    size: int,
    records: int,
    partition: dict[str, str | None],
    stats: FileStats | None = None,
) -> pb.FileEntry:
    """A listed file (an ``EntryFactory``: listings build messages directly)."""
    return pb.FileEntry(
        path=path,
        size_bytes=size,
        record_count=records,
        partition=[pb.PartitionValue(column=c, value=v) for c, v in partition.items()],
        stats_json=encode_stats(stats),
    )


def entry_to_pb(entry: FileEntry) -> pb.FileEntry:
    return file_to_pb(
        entry.path, entry.size_bytes, entry.record_count, entry.partition, entry.stats
    )


def entries_to_pb(entries: Iterable[FileEntry]) -> list[pb.FileEntry]:
    return [entry_to_pb(e) for e in entries]


def partition_from_pb(values: Iterable[pb.PartitionValue]) -> dict[str, str | None]:
    return {v.column: v.value if v.HasField("value") else None for v in values}


def entry_from_pb(msg: pb.FileEntry) -> FileEntry:
    """A file entry; malformed statistics raise ``ValueError`` (the service checks them)."""
    return FileEntry(
        msg.path,
        msg.size_bytes,
        msg.record_count,
        partition_from_pb(msg.partition),
        decode_stats(msg.stats_json),
    )


def mark_to_pb(app_id: str | None, batch_id: int | str | None) -> pb.BatchMark | None:
    if app_id is None or batch_id is None:
        return None
    if isinstance(batch_id, int):
        return pb.BatchMark(app_id=app_id, int_id=batch_id)
    return pb.BatchMark(app_id=app_id, str_id=batch_id)


def mark_from_pb(msg: pb.BatchMark) -> tuple[str, int | str]:
    kind = msg.WhichOneof("batch_id")
    if kind == "int_id":
        return msg.app_id, msg.int_id
    if kind == "str_id":
        return msg.app_id, msg.str_id
    raise ValueError("a batch mark needs its batch_id (an int or a string)")


def read_set_to_pb(read_set: ReadSet | None) -> pb.ReadSet | None:
    if read_set is None:
        return None
    return pb.ReadSet(
        version=read_set.version,
        removes=list(read_set.removes),
        conditions_json=read_set.conditions_json(),
        reads=list(read_set.reads),
    )


def read_set_from_pb(msg: pb.ReadSet) -> ReadSet:
    """A read set; malformed conditions raise ``ValueError`` (the service checks them)."""
    conditions = ReadSet.parse_conditions(msg.conditions_json)
    return ReadSet(msg.version, tuple(msg.removes), conditions, tuple(msg.reads))
