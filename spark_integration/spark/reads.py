"""Snapshot reads: one Spark scan over exactly the files of one committed version."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from spark_integration.engine.locations import join
from spark_integration.engine.model import FileEntry
from spark_integration.spark.filesystem import spark_path
from spark_integration.spark.schema import JOB_COLUMN, quote

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession


def read_version(
    spark: SparkSession | ConnectSession,
    schema: StructType,
    partition_by: tuple[str, ...],
    location: str,
    files: Sequence[FileEntry],
) -> DataFrame:
    """The rows of ``files`` with the table's columns, in the table's column order.

    Spark gets the file list itself, never a folder to list, so files that no
    commit names (a running or failed job's) are never read. The table location
    is the partition base path: each file's ``_lh_job=<id>/col=value/`` folders
    become the hidden job column plus the real partition columns, with the types
    of the table schema (no inference).
    """
    if not files:
        return spark.createDataFrame([], schema)
    by_name = {f.name: f for f in schema.fields}
    data = [f for f in schema.fields if f.name not in partition_by]
    partitions = [by_name[c] for c in partition_by]
    read_schema = StructType([*data, StructField(JOB_COLUMN, StringType(), True), *partitions])
    paths = [spark_path(join(location, f.path)) for f in files]
    scanned = (
        spark.read.schema(read_schema).option("basePath", spark_path(location)).parquet(*paths)
    )
    # Column names as strings, not ``F.col``: a process that has a classic SparkContext
    # would build classic Columns, which a Spark Connect DataFrame cannot take.
    return scanned.select(*[quote(name) for name in schema.fieldNames()])
