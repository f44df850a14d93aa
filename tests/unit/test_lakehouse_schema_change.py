"""Schema evolution's pure rules: widening, merging, added columns, the schema of an
old version, and which concurrent schema change a commit conflicts with."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_integration.engine.commit import CommitRequest, _schema_conflict
from spark_integration.engine.model import ADD_COLUMNS, APPEND, Head, TableMeta
from spark_integration.spark.schema_change import added_schema, merged_schema, whole_table, widens

pytestmark = pytest.mark.unit

TABLE = StructType(
    [
        StructField("id", LongType(), False),
        StructField("amount", IntegerType()),
        StructField("ratio", FloatType()),
    ]
)


def test_only_lossless_widenings_are_safe() -> None:
    assert widens(IntegerType(), LongType())
    assert widens(FloatType(), DoubleType())
    assert not widens(LongType(), IntegerType())
    assert not widens(IntegerType(), DoubleType())  # loses nothing, but Parquet cannot
    assert not widens(IntegerType(), StringType())


def test_merge_adds_nullable_columns_widens_and_refuses_other_changes() -> None:
    incoming = StructType(
        [
            StructField("id", IntegerType()),  # narrower: kept, cast up on write
            StructField("amount", LongType()),
            StructField("note", StringType(), False),
        ]
    )
    merged = merged_schema("t", TABLE, incoming)
    assert merged.simpleString() == "struct<id:bigint,amount:bigint,ratio:float,note:string>"
    assert merged["note"].nullable and not merged["id"].nullable
    assert merged_schema("t", TABLE, TABLE) == TABLE
    bad = StructType([StructField("ratio", StringType())])
    with pytest.raises(ValueError, match=r"column 'ratio' of table 't' from float to string"):
        merged_schema("t", TABLE, bad)
    with pytest.raises(ValueError, match="'AMOUNT' differs only in case"):
        merged_schema("t", TABLE, StructType([StructField("AMOUNT", IntegerType())]))


def test_added_columns_must_be_new_and_nullable() -> None:
    added = added_schema("t", TABLE, StructType([StructField("c", StringType())]))
    assert added.fieldNames() == ["id", "amount", "ratio", "c"]
    with pytest.raises(ValueError, match="already has a column 'amount'"):
        added_schema("t", TABLE, StructType([StructField("Amount", LongType())]))
    with pytest.raises(ValueError, match="'c' is NOT NULL"):
        added_schema("t", TABLE, StructType([StructField("c", LongType(), False)]))
    with pytest.raises(ValueError, match="at least one column"):
        added_schema("t", TABLE, StructType([]))
    with pytest.raises(TypeError, match="DDL string or a StructType"):
        added_schema("t", TABLE, 3)
    with pytest.raises(ValueError, match="replace_where or dynamic"):
        whole_table("dynamic", True)
    assert whole_table("static", True) and not whole_table("dynamic", False)


def test_time_travel_finds_the_schema_each_version_had_and_metadata_round_trips() -> None:
    meta = TableMeta("t", "s0", ("day",), "/w/t", 1)
    assert meta.schema_at(7) == "s0"
    evolved = meta.with_schema("s3", 3).with_schema("s5", 5)
    assert [evolved.schema_at(v) for v in range(7)] == ["s0", "s0", "s0", "s3", "s3", "s5", "s5"]
    assert TableMeta.decode(evolved.encode()) == evolved
    assert TableMeta.decode(meta.encode()) == meta
    head = Head(9, 1, 2, 3, 0, 0, 5, 4)
    assert Head.decode(head.encode()) == head


def test_a_schema_change_conflicts_with_any_other_and_files_only_with_a_replaced_schema() -> None:
    def request(schema_version: int | None, new: str | None = None) -> CommitRequest:
        operation = ADD_COLUMNS if new is not None else APPEND
        return CommitRequest(
            operation, (), "j", 0, schema_version=schema_version, new_schema_json=new
        )

    added_at_4 = Head(6, 0, 0, 0, schema_version=4)
    replaced_at_5 = Head(6, 1, 5, 0, schema_version=5, schema_break=5)
    assert _schema_conflict("t", added_at_4, request(0)) is None  # old files read fine
    assert _schema_conflict("t", added_at_4, request(None)) is None  # unchecked caller
    assert _schema_conflict("t", added_at_4, request(4, "s")) is None
    conflict = _schema_conflict("t", added_at_4, request(0, "s"))
    assert conflict is not None and "version 4 changed the schema" in str(conflict)
    conflict = _schema_conflict("t", replaced_at_5, request(4))
    assert conflict is not None and "version 5 replaced the schema" in str(conflict)
    assert _schema_conflict("t", replaced_at_5, request(5)) is None


def test_the_data_source_parses_and_checks_the_schema_options() -> None:
    from spark_integration.spark.datasource.options import read_options, write_options

    assert write_options({"path": "t", "MergeSchema": "TRUE"}).merge_schema
    opts = write_options({"path": "t", "overwriteSchema": "true"})
    assert opts.overwrite_schema and not opts.merge_schema
    for options, problem in [
        ({"mergeSchema": "true", "overwriteSchema": "true"}, "not both"),
        ({"overwriteSchema": "true", "replaceWhere": "day = 'd1'"}, "whole table"),
        ({"overwriteSchema": "true", "partitionOverwriteMode": "dynamic"}, "whole table"),
        ({"mergeSchema": "yes"}, "mergeSchema must be true or false"),
    ]:
        with pytest.raises(ValueError, match=problem):
            write_options({"path": "t", **options})
    with pytest.raises(ValueError, match="mergeSchema is for batch writes"):
        read_options({"path": "t", "mergeSchema": "true"})
