"""Table schemas: parsing, validation at creation, and matching a DataFrame against one."""

from __future__ import annotations

import re
from collections.abc import Iterable

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StructField,
    StructType,
)

#: Spark writes each job's files under ``<location>/_lh_job=<job id>/``; reads use the
#: table location as the partition base path, so this is a hidden partition column
#: that lets Spark read files from many job folders in one scan. Never a user column.
JOB_COLUMN = "_lh_job"

#: Partition columns become directory names: keep them plain.
_PARTITION_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_schema(schema: object) -> StructType:
    """A ``StructType``, or a DDL string parsed by the active Spark session."""
    if isinstance(schema, StructType):
        return schema
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a StructType or a DDL string, got {type(schema).__name__}")
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:
        raise ValueError(
            "a DDL schema string needs an active SparkSession to parse it; "
            "start one or pass a StructType"
        )
    try:
        parsed = DataType.fromDDL(schema)
    except Exception as exc:  # pyspark's ParseException has no stable import path
        raise ValueError(f"invalid DDL schema {schema!r}: {exc}") from exc
    if not isinstance(parsed, StructType):
        raise ValueError(f"schema {schema!r} is a {parsed.simpleString()}, not a list of columns")
    return parsed


def check_table_schema(schema: StructType, partition_by: tuple[str, ...]) -> None:
    """Refuse schemas a table cannot hold, naming the problem."""
    if not schema.fields:
        raise ValueError("a table needs at least one column")
    seen: set[str] = set()
    for f in schema.fields:
        if not f.name:
            raise ValueError("column names must not be empty")
        if f.name.lower() in seen:
            raise ValueError(f"duplicate column {f.name!r} (names are case-insensitive)")
        seen.add(f.name.lower())
        if f.name.lower() == JOB_COLUMN:
            raise ValueError(f"column name {JOB_COLUMN!r} is reserved")
    by_name = {f.name: f for f in schema.fields}
    if len(set(partition_by)) != len(partition_by):
        raise ValueError(f"duplicate partition columns in {list(partition_by)}")
    for column in partition_by:
        if column not in by_name:
            raise ValueError(f"partition column {column!r} is not a column of the schema")
        if not _PARTITION_COLUMN.fullmatch(column):
            raise ValueError(
                f"partition column {column!r} must match [A-Za-z_][A-Za-z0-9_]* "
                "(it names directories)"
            )
        kind = by_name[column].dataType
        if isinstance(kind, StructType | ArrayType | MapType | BinaryType):
            raise ValueError(f"partition column {column!r} has type {kind.simpleString()}")
    if partition_by and len(partition_by) == len(schema.fields):
        raise ValueError("at least one column must not be a partition column")


def without_nullability(kind: DataType) -> DataType:
    """``kind`` with every nested field, element and value nullable (for comparisons)."""
    if isinstance(kind, StructType):
        return StructType(
            [StructField(f.name, without_nullability(f.dataType), True) for f in kind.fields]
        )
    if isinstance(kind, ArrayType):
        return ArrayType(without_nullability(kind.elementType), True)
    if isinstance(kind, MapType):
        return MapType(without_nullability(kind.keyType), without_nullability(kind.valueType))
    return kind


def check_dataframe_schema(table: str, expected: StructType, actual: StructType) -> None:
    """Columns must match by name and type; order and nullability may differ.

    Nullability is not compared: Spark marks most computed columns nullable, and
    Parquet files written by Spark carry every column as optional anyway.
    """
    want = {f.name: f.dataType for f in expected.fields}
    got = {f.name: f.dataType for f in actual.fields}
    problems = []
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unexpected columns {extra}")
    if len(actual.fields) != len(got):
        problems.append("duplicate column names")
    for n in want.keys() & got.keys():
        if without_nullability(want[n]) != without_nullability(got[n]):
            problems.append(
                f"column {n!r} is {got[n].simpleString()}, the table has {want[n].simpleString()}"
            )
    if problems:
        raise ValueError(
            f"DataFrame schema does not match table {table!r}: " + "; ".join(sorted(problems))
        )


def quote(column: str) -> str:
    """A column reference that Spark takes literally (dots, spaces, backticks)."""
    return "`" + column.replace("`", "``") + "`"


def names(fields: Iterable[StructField]) -> list[str]:
    return [f.name for f in fields]
