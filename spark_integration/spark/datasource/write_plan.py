"""What batch and streaming writes share: the target, the task side, the table to write.

Tasks write Parquet into job folders and report their files in a :class:`FilesWritten`
message; the driver side makes the reported files one version.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from spark_integration.engine.errors import TableExistsError, TableNotFoundError
from spark_integration.engine.model import FileEntry, TableMeta
from spark_integration.spark import filesystem, schema_change
from spark_integration.spark.datasource.gateway import CATALOG, GatewayCatalog, table_schema
from spark_integration.spark.schema import check_dataframe_schema

log = logging.getLogger(__name__)


def task_tag() -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return uuid.uuid4().hex[:8]
    return f"{ctx.partitionId():05d}-{ctx.attemptNumber()}"


def remove_folders(folders: Sequence[str]) -> None:
    """Delete job folders (on S3, every object under the prefix), best effort.

    A straggling task may still write there, and a store that does not answer
    leaves them: vacuum removes what is left once no version names it.
    """
    for folder in folders:
        filesystem.delete_tree(folder)


@dataclass(frozen=True, slots=True)
class WriteTarget:
    """Where and how tasks write: the table's folder, column order and partitioning."""

    table: str
    gateway: str
    location: str
    columns: tuple[str, ...]
    partition_by: tuple[str, ...]


@dataclass(frozen=True)
class FilesWritten(WriterCommitMessage):
    """What one task wrote: its files (paths relative to the table location)."""

    files: tuple[FileEntry, ...] = ()
    #: The task's own job folder (streaming writes) and when it started.
    folder: str | None = None
    started_ms: int | None = None
    #: The session's ``spark.sql.sources.partitionOverwriteMode`` as the task read it
    #: (batch overwrites without the write option only).
    overwrite_mode: str | None = None


def files_of(messages: Sequence[WriterCommitMessage | None]) -> list[FileEntry]:
    out: list[FileEntry] = []
    for message in messages:
        if isinstance(message, FilesWritten):
            out.extend(message.files)
    return out


def prepare_table(catalog: GatewayCatalog, opts: Any, schema: StructType) -> TableMeta:
    """The table to write, created from the DataFrame's schema when asked and missing.

    ``opts`` is a write or streaming write option set. Checks the DataFrame's schema
    and the ``partitionColumns`` option against the table's.
    """
    try:
        meta = catalog.meta(opts.table)
    except TableNotFoundError:
        if not opts.create_if_missing:
            raise TableNotFoundError(
                f"percolake: table {opts.table!r} does not exist; create it, or pass "
                "option createIfMissing=true (with warehouse and, if wanted, partitionColumns)"
            ) from None
        meta = create_table(catalog, opts, schema)
    if opts.partition_by is not None and tuple(opts.partition_by) != meta.partition_by:
        raise ValueError(
            f"percolake: option partitionColumns {list(opts.partition_by)} does not match "
            f"table {opts.table!r}, which is partitioned by {list(meta.partition_by)}"
        )
    if not (getattr(opts, "merge_schema", False) or getattr(opts, "overwrite_schema", False)):
        check_dataframe_schema(opts.table, table_schema(meta), schema)
    return meta


def create_table(catalog: GatewayCatalog, opts: Any, schema: StructType) -> TableMeta:
    from spark_integration.spark.lakehouse import Lakehouse

    # The catalog's own manager: Lakehouse checks names, schema and location as usual.
    lh = Lakehouse(catalog.manager, opts.warehouse, catalog=CATALOG)
    try:
        lh.create_table(opts.table, schema, tuple(opts.partition_by or ()))
    except TableExistsError:
        log.info("table %s was created concurrently; writing to it", opts.table)
    return catalog.prepare(opts.table).meta


def write_target(opts: Any, meta: TableMeta) -> WriteTarget:
    return WriteTarget(
        opts.table,
        opts.gateway,
        meta.location,
        tuple(table_schema(meta).fieldNames()),
        meta.partition_by,
    )


def evolved_target(
    opts: Any, meta: TableMeta, schema: StructType, overwrite: bool
) -> tuple[WriteTarget, str | None]:
    """A ``mergeSchema`` or ``overwriteSchema`` write: its target and the schema it sets.

    Tasks write the DataFrame's own columns: a table column it lacks reads as NULL
    from these files, as from files older than the column.
    """
    if opts.overwrite_schema and not overwrite:
        raise ValueError("percolake: option overwriteSchema needs mode('overwrite')")
    missing = [c for c in meta.partition_by if c not in schema.fieldNames()]
    if missing:
        raise ValueError(f"percolake: the DataFrame lacks partition columns {missing}")
    _, new_schema = schema_change.target(
        opts.table, meta, schema, opts.merge_schema, opts.overwrite_schema
    )
    target = WriteTarget(
        opts.table, opts.gateway, meta.location, tuple(schema.fieldNames()), meta.partition_by
    )
    return target, new_schema
