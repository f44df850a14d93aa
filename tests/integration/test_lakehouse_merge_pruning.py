"""MERGE prunes target files by the source's key range (issue 26, merge speed).

A conjunct ``target.id = source.id`` on a column with statistics: a target row whose
``id`` lies outside the source's ``[min, max]`` joins no source row, so the files
outside it are neither read nor part of what the statement depends on. Shown through
the read set: an append outside the range landing just before the MERGE commits
leaves it valid, one inside makes it lose. Embedded only: the commit path is the
same through a gateway (test_lakehouse_dml.py runs MERGE remotely).
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import ConcurrentModificationError, Lakehouse
from spark_integration.engine import lakehouse_failpoints as fp

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])
ON = "target.id = source.id"


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)
def test_merge_depends_only_on_files_inside_the_sources_key_range(
    lh: Lakehouse, spark: SparkSession
) -> None:
    def rows(*ids: int | None, v: str = "a") -> DataFrame:
        return spark.createDataFrame([(i, v) for i in ids], SCHEMA).coalesce(1)

    def append_first(*ids: int, v: str) -> None:
        """Append ``ids`` from the MERGE's before-commit point: after it read, before it commits."""

        def append(_: str) -> None:
            lh.append("keyed", rows(*ids, v=v))

        lh.failpoints.enable(fp.BEFORE_COMMIT, append, times=1)

    lh.create_table("keyed", SCHEMA)
    for low in (0, 10, 20):  # three files: ids 0-9, 10-19, 20-29
        lh.append("keyed", rows(*range(low, low + 10)))

    # Keys 12..18: an append of key 100 commits first and does not conflict.
    append_first(100, v="a")
    source = rows(12, 15, 18, v="b")
    got = lh.merge("keyed", source, ON).when_matched_update_all().execute()
    assert (got.version, got.rows_updated, got.files_removed, got.files_added) == (5, 3, 1, 1)

    # Keys 11..14: an append of key 13 (inside the range) lands first: the MERGE loses,
    # as its insert of 13 would now duplicate it, and commits nothing.
    append_first(13, v="c")
    with pytest.raises(ConcurrentModificationError):
        (
            lh.merge("keyed", rows(11, 13, 14, v="d"), ON)
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
    assert lh.version("keyed") == 6  # the append's

    # Every key NULL: no target row can match; the rows are inserted, no file is read.
    got = lh.merge("keyed", rows(None, v="e"), ON).when_not_matched_insert_all().execute()
    assert (got.version, got.rows_inserted, got.files_removed) == (7, 1, 0)
    values = sorted(
        (r["id"] if r["id"] is not None else -1, r["v"]) for r in lh.read(spark, "keyed").collect()
    )
    want = sorted(
        [(i, "b" if i in (12, 15, 18) else "a") for i in range(30)]
        + [(100, "a"), (13, "c"), (-1, "e")]
    )
    assert values == want
