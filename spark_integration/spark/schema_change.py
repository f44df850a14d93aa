"""Schema evolution (``mergeSchema``, ``overwriteSchema``, ``add_columns``), drop and rename.

A schema change is a commit like any other (``CommitRequest.new_schema_json``): the
table's metadata keeps every earlier schema with the version it started at, so time
travel reads an old version with its own schema, and the commit point checks it
against concurrent schema changes (``engine.commit._schema_conflict``). Old files are
never rewritten: Spark reads them with the new schema, a column they lack as NULL
and a widened column widened (Parquet's int32 read as bigint, float as double).
"""

from __future__ import annotations

import json
import logging
import uuid

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StructField,
    StructType,
)

from spark_integration.engine import Catalog, now_ms
from spark_integration.engine.model import ADD_COLUMNS, TableMeta
from spark_integration.service.client import RemoteCatalog
from spark_integration.spark.schema import (
    check_dataframe_schema,
    check_table_schema,
    parse_schema,
    quote,
    without_nullability,
)

log = logging.getLogger(__name__)

#: Safe widenings: every value of the narrower type is one of the wider, and Spark's
#: Parquet readers read the narrower physical type as the wider one.
_WIDER: dict[type[DataType], tuple[type[DataType], ...]] = {
    ByteType: (ShortType, IntegerType, LongType),
    ShortType: (IntegerType, LongType),
    IntegerType: (LongType,),
    FloatType: (DoubleType,),
}


def widens(old: DataType, new: DataType) -> bool:
    """Whether a column of type ``old`` may become ``new`` without rewriting files."""
    return type(new) in _WIDER.get(type(old), ())


def merged_schema(table: str, schema: StructType, incoming: StructType) -> StructType:
    """The table's schema evolved to take ``incoming``'s rows (``mergeSchema``).

    Columns ``incoming`` adds are appended, nullable; a column it has with a wider
    type (int -> bigint, float -> double) is widened; a narrower one is kept (the
    rows are cast up on write); any other type change is refused naming the column
    and both types. Columns it lacks stay, written as NULL.
    """
    got = {f.name: f for f in incoming.fields}
    fields: list[StructField] = []
    for f in schema.fields:
        other = got.pop(f.name, None)
        if other is None:
            fields.append(f)
            continue
        old, new = without_nullability(f.dataType), without_nullability(other.dataType)
        if old == new or widens(new, old):
            fields.append(f)
        elif widens(old, new):
            fields.append(StructField(f.name, other.dataType, True, f.metadata))
        else:
            raise ValueError(
                f"mergeSchema cannot change column {f.name!r} of table {table!r} from "
                f"{f.dataType.simpleString()} to {other.dataType.simpleString()}: only "
                "widening (tinyint/smallint/int -> bigint, float -> double) is safe"
            )
    taken = {f.name.lower() for f in fields}
    for other in got.values():
        if other.name.lower() in taken:
            raise ValueError(
                f"column {other.name!r} differs only in case from a column of table {table!r}"
            )
        fields.append(StructField(other.name, other.dataType, True, other.metadata))
    return StructType(fields)


def replaced_schema(table: str, incoming: StructType, partition_by: tuple[str, ...]) -> StructType:
    """The table's schema replaced by ``incoming``'s (``overwriteSchema``).

    The partitioning stays: its columns must be in the new schema.
    """
    try:
        check_table_schema(incoming, partition_by)
    except ValueError as exc:
        raise ValueError(f"overwriteSchema of table {table!r}: {exc}") from None
    return incoming


def added_schema(table: str, schema: StructType, ddl: object) -> StructType:
    """The table's schema with the columns of ``ddl`` (``"c1 INT, c2 STRING"``) added."""
    if not isinstance(ddl, str | StructType):
        raise TypeError(f"columns must be a DDL string or a StructType, got {type(ddl).__name__}")
    added = parse_schema(ddl)
    if not added.fields:
        raise ValueError("add_columns needs at least one column")
    taken = {f.name.lower(): f.name for f in schema.fields}
    for f in added.fields:
        if f.name.lower() in taken:
            raise ValueError(f"table {table!r} already has a column {taken[f.name.lower()]!r}")
        if not f.nullable:
            raise ValueError(
                f"column {f.name!r} is NOT NULL: an added column must be nullable "
                "(the table's existing rows have no value for it)"
            )
    new = StructType([*schema.fields, *added.fields])
    check_table_schema(new, ())
    return new


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` with exactly ``schema``'s columns: narrower ones cast up, missing ones NULL."""
    have = set(df.columns)
    return df.select(
        *[
            (F.col(quote(f.name)) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        ]
    )


def add_columns(catalog: Catalog | RemoteCatalog, name: str, columns: object) -> int:
    """``Lakehouse.add_columns``: commit the wider schema as a version of its own."""
    prepared = catalog.prepare(name)
    schema = StructType.fromJson(json.loads(prepared.meta.schema_json))
    new = added_schema(name, schema, columns)
    committed = catalog.commit_files(
        name,
        ADD_COLUMNS,
        [],
        job_id=f"schema-{uuid.uuid4().hex[:16]}",
        job_started_ms=now_ms(),
        schema_version=prepared.head.schema_version,
        new_schema_json=new.json(),
    )
    return committed.version


def evolve(
    table: str,
    schema: StructType,
    incoming: StructType,
    partition_by: tuple[str, ...],
    *,
    merge: bool,
    replace: bool,
) -> StructType:
    """The schema a write commits under: the table's, merged, or replaced."""
    if merge and replace:
        raise ValueError("pass merge_schema or overwrite_schema, not both")
    if replace:
        return replaced_schema(table, incoming, partition_by)
    if merge:
        return merged_schema(table, schema, incoming)
    return schema


def target(
    table: str, meta: TableMeta, incoming: StructType, merge: bool, replace: bool
) -> tuple[StructType, str | None]:
    """The schema a job writes with, and the schema its commit sets (None: unchanged).

    Without ``merge`` or ``replace`` the DataFrame must match the table's schema.
    """
    schema = StructType.fromJson(json.loads(meta.schema_json))
    if not merge and not replace:
        check_dataframe_schema(table, schema, incoming)
        return schema, None
    new = evolve(table, schema, incoming, meta.partition_by, merge=merge, replace=replace)
    return new, (None if new == schema else new.json())


def whole_table(mode: str, overwrite_schema: bool) -> bool:
    """Whether an overwrite in ``mode`` replaces the whole table (``overwriteSchema`` must)."""
    if overwrite_schema and mode != "static":
        raise ValueError(
            "overwrite_schema replaces the whole table's schema: it cannot go with "
            "replace_where or dynamic partition overwrite"
        )
    return mode == "static"


def drop_table(catalog: Catalog | RemoteCatalog, name: str) -> None:
    """``Lakehouse.drop_table``: the metadata in one transaction; the files stay.

    A reader that listed the table's files before the drop still reads them; a
    vacuum of the name removes them once its retention has passed since the drop
    (``vacuum_sweep.vacuum_dropped``), and a table created at the location meanwhile
    removes them with its own vacuum.
    """
    meta = catalog.drop_table(name)
    log.info("dropped table %s; its files at %s stay until a vacuum", name, meta.location)


def rename_table(catalog: Catalog | RemoteCatalog, old: str, new: str) -> None:
    """``Lakehouse.rename_table``: atomic; the files stay at the old location."""
    catalog.rename_table(old, new)
    log.info("renamed table %s to %s", old, new)
