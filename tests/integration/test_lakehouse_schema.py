"""Schema evolution on lakehouse tables, end to end: a real local Spark session, an
embedded manager and a real gateway process (``percolake serve``), a local warehouse.

One test per topology runs the whole story with few Spark jobs: ``add_columns``,
``merge_schema`` (a new column and a widened one), refusals that commit nothing,
reads of old files under the new schema, time travel to the old schema, an append
beside a schema change (both commit), and an append that loses to an
``overwrite_schema`` (its files cannot be read under the new schema).
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, DataFrameReader, DataFrameWriter, SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from spark_integration import (
    ConcurrentModificationError,
    Lakehouse,
    TableExistsError,
    TableNotFoundError,
)
from spark_integration.engine import lakehouse_failpoints as fp
from txn import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("amount", IntegerType()),
        StructField("day", StringType()),
    ]
)


def test_schema_evolves_by_commits_that_old_files_and_time_travel_read(
    lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("events", SCHEMA, partition_by="day")
    old = spark.createDataFrame([(1, 10, "d1")], SCHEMA)
    assert lh.append("events", old) == 1

    # Refusals name the problem and commit nothing.
    for ddl, problem in [
        ("ID INT", "already has a column 'id'"),
        ("x INT NOT NULL", "must be nullable"),
        ("x INTT", "invalid DDL"),
    ]:
        with pytest.raises(ValueError, match=problem):
            lh.add_columns("events", ddl)
    wrong = spark.createDataFrame([(2, "a", "d1")], "id BIGINT, amount STRING, day STRING")
    with pytest.raises(ValueError, match=r"'amount'.*from int to string"):
        lh.append("events", wrong, merge_schema=True)
    assert lh.version("events") == 1

    # While an append under the old schema is about to commit, a column is added:
    # its files read with the new column as NULL, so both commit.
    lh.failpoints.enable(
        fp.BEFORE_COMMIT, lambda _: lh.add_columns("events", "country STRING"), times=1
    )
    assert lh.append("events", spark.createDataFrame([(2, 20, "d2")], SCHEMA)) == 3
    assert [c.operation for c in lh.history("events")][1:] == ["WRITE", "ADD COLUMNS", "WRITE"]

    # merge_schema adds a column and widens amount (int -> bigint); columns the
    # DataFrame lacks (country) are written as NULL.
    wider = spark.createDataFrame(
        [(3, 2**40, "d1", "n")], "id BIGINT, amount BIGINT, day STRING, note STRING"
    )
    assert lh.append("events", wider, merge_schema=True) == 4
    assert lh.schema("events").simpleString() == (
        "struct<id:bigint,amount:bigint,day:string,country:string,note:string>"
    )
    assert sorted(tuple(r) for r in lh.read(spark, "events").collect()) == [
        (1, 10, "d1", None, None),
        (2, 20, "d2", None, None),
        (3, 2**40, "d1", None, "n"),
    ]
    # Time travel reads a version with the schema it had.
    before = lh.read(spark, "events", version=1)
    assert before.schema.simpleString() == "struct<id:bigint,amount:int,day:string>"
    assert [tuple(r) for r in before.collect()] == [(1, 10, "d1")]

    # An append prepared under the old schema loses to an overwrite that replaced it.
    replaced = spark.createDataFrame([("x", "d9")], "key STRING, day STRING")
    lh.failpoints.enable(
        fp.BEFORE_COMMIT,
        lambda _: lh.overwrite("events", replaced, overwrite_schema=True),
        times=1,
    )
    with pytest.raises(ConcurrentModificationError, match="replaced the schema"):
        lh.append("events", wider.drop("note", "country"), merge_schema=True)
    assert lh.version("events") == 5
    assert lh.history("events")[-1].operation == "OVERWRITE"
    assert [tuple(r) for r in lh.read(spark, "events").collect()] == [("x", "d9")]


def test_rename_is_atomic_and_keeps_files_and_drop_frees_the_name(
    lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("events", SCHEMA, partition_by="day")
    lh.create_table("other", SCHEMA)
    assert lh.append("events", spark.createDataFrame([(1, 10, "d1")], SCHEMA)) == 1
    (before,) = lh.files("events")
    with pytest.raises(TableExistsError, match="'other' already exists"):
        lh.rename_table("events", "other")
    lh.rename_table("events", "renamed")
    assert sorted(lh.list_tables()) == ["other", "renamed"]
    assert lh.files("renamed") == [before]  # same path: the files stayed
    assert [c.operation for c in lh.history("renamed")] == ["CREATE TABLE", "WRITE"]
    assert [tuple(r) for r in lh.read(spark, "renamed", version=1).collect()] == [(1, 10, "d1")]
    with pytest.raises(TableNotFoundError, match="'events'"):
        lh.version("events")

    lh.drop_table("renamed")
    assert lh.list_tables() == ["other"]
    with pytest.raises(TableNotFoundError, match="'renamed'"):
        lh.read(spark, "renamed", version=1)
    # The files go with vacuum, not with the drop: a reader that listed them a moment
    # before still reads them, and a vacuum inside the retention removes nothing.
    assert pq.read_table(before.path).num_rows == 1
    assert lh.vacuum("renamed", 3600) == []
    assert Path(before.path).exists()
    time.sleep(0.01)  # the drop time lies in the past: a retention of 0 has passed
    assert lh.vacuum("renamed", 0)
    assert not Path(before.path).exists()
    assert list(Path(lh.warehouse, "events").iterdir()) == []  # job folders and all
    with pytest.raises(TableNotFoundError, match="no dropped table of that name"):
        lh.vacuum("renamed", 0)  # the record went with the sweep
    # Both names are free again, and the new tables start from version 0.
    lh.create_table("events", SCHEMA, partition_by="day")
    lh.create_table("renamed", SCHEMA)
    assert lh.version("events") == 0 and lh.version("renamed") == 0
    assert lh.files("events") == []


def test_a_table_created_over_a_dropped_one_reads_only_its_rows_and_vacuums_the_old(
    lh: Lakehouse, spark: SparkSession
) -> None:
    lh.create_table("t", SCHEMA, partition_by="day")
    lh.append("t", spark.createDataFrame([(1, 10, "d1"), (2, 20, "d2")], SCHEMA))
    old = lh.files("t")
    lh.drop_table("t")
    assert all(Path(f.path).exists() for f in old)
    # The name and its location are free, though the dropped table's files are there.
    lh.create_table("t", SCHEMA, partition_by="day")
    assert lh.version("t") == 0 and lh.files("t") == []
    assert lh.append("t", spark.createDataFrame([(3, 30, "d1")], SCHEMA)) == 1
    assert [tuple(r) for r in lh.read(spark, "t").collect()] == [(3, 30, "d1")]
    (new,) = lh.files("t")
    # The new table's vacuum removes the old files (no version of it names them, and
    # they are older than its cutoff), never its own.
    removed = lh.vacuum("t", 0)
    assert {Path(f.path).name for f in old} <= {Path(p).name for p in removed}
    assert not any(Path(f.path).exists() for f in old)
    assert Path(new.path).exists()
    assert [tuple(r) for r in lh.read(spark, "t").collect()] == [(3, 30, "d1")]


def test_data_source_merges_and_overwrites_the_schema_and_reads_old_files_with_it(
    tmp_path: Path, spark: SparkSession
) -> None:
    from spark_integration import register
    from tests.servers import ServerProcess

    server = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/gw.db"], tmp_path).start()
    tm = TransactionManager.remote(server.address)
    try:
        register(spark)
        lh = Lakehouse(tm, str(tmp_path / "warehouse"))
        lh.create_table("events", SCHEMA, partition_by="day")
        assert lh.append("events", spark.createDataFrame([(1, 10, "d1")], SCHEMA)) == 1

        def write(df: DataFrame, mode: str = "append") -> DataFrameWriter:
            return df.write.format("percolake").mode(mode).option("gateway", server.address)

        def read() -> DataFrameReader:
            return spark.read.format("percolake").option("gateway", server.address)

        new = spark.createDataFrame(
            [(2, 2**40, "d2", "n")], "id BIGINT, amount BIGINT, day STRING, note STRING"
        )
        with pytest.raises(Exception, match="unexpected columns"):
            write(new).save("events")
        with pytest.raises(Exception, match=r"overwriteSchema needs mode\('overwrite'\)"):
            write(new).option("overwriteSchema", "true").save("events")
        write(new).option("mergeSchema", "true").save("events")
        assert lh.version("events") == 2
        assert lh.schema("events").simpleString() == (
            "struct<id:bigint,amount:bigint,day:string,note:string>"
        )
        # The batch reader reads the old file with the new schema, and time travel
        # with the old one.
        assert sorted(tuple(r) for r in read().load("events").collect()) == [
            (1, 10, "d1", None),
            (2, 2**40, "d2", "n"),
        ]
        old = read().option("versionAsOf", 1).load("events")
        assert old.schema.simpleString() == "struct<id:bigint,amount:int,day:string>"
        assert [tuple(r) for r in old.collect()] == [(1, 10, "d1")]

        replaced = spark.createDataFrame([("x", "d9")], "key STRING, day STRING")
        write(replaced, "overwrite").option("overwriteSchema", "true").save("events")
        assert lh.history("events")[-1].operation == "OVERWRITE"
        assert lh.schema("events").fieldNames() == ["key", "day"]
        assert [tuple(r) for r in lh.read(spark, "events").collect()] == [("x", "d9")]
    finally:
        tm.close()
        server.stop()
