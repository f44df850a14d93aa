"""The small partitioned table the DML, change-feed and compaction tests share."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import Lakehouse
from spark_integration.engine.locations import join
from spark_integration.spark import filesystem

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("amount", LongType()),
        StructField("day", StringType()),
    ]
)
#: id, amount, day: three days, one file each, a negative amount in d1 and d2.
ROWS = [(1, 10, "d1"), (2, -5, "d1"), (3, 7, "d1"), (4, -1, "d2"), (5, 3, "d2"), (6, 8, "d3")]


def make_table(lh: Lakehouse, spark: SparkSession, name: str = "events") -> int:
    """Create ``name`` partitioned by day with ``ROWS``; returns the version (1)."""
    lh.create_table(name, SCHEMA, partition_by="day")
    return lh.append(name, spark.createDataFrame(ROWS, SCHEMA).coalesce(1))


def table_rows(lh: Lakehouse, spark: SparkSession, version: int | None = None) -> list[tuple]:
    got = lh.read(spark, "events", version=version).collect()
    return sorted((r["id"], r["amount"], r["day"]) for r in got)


def job_folders(lh: Lakehouse) -> list[str]:
    names = (p.rsplit("/", 1)[-1] for p in filesystem.list_dirs(join(lh.warehouse, "events")))
    return sorted(n for n in names if n.startswith("_lh_job="))
