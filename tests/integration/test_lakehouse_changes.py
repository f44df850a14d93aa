"""The change data feed (``lh.changes``), end to end, embedded and through a gateway.

Each kind of version gives exactly the change rows Delta's feed gives: appends insert,
overwrites (whole table, replaceWhere) delete the rows of the files they removed and
insert those they wrote, DELETE, UPDATE and MERGE give only the rows they changed (from
the change files they commit), a schema change gives nothing. The table is partitioned
by ``day`` so that a statement's survivors (rows it copies unchanged) exist and must not
appear.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import Lakehouse, Retention, TableNotFoundError, VersionNotFoundError
from spark_integration.spark.changes import plan_changes
from spark_integration.spark.datasource import register
from spark_integration.spark.datasource.change_read import change_files
from spark_integration.spark.datasource.gateway import open_gateway
from tests.integration.lakehouse_tables import ROWS, SCHEMA
from tests.integration.lakehouse_tables import make_table as make_events
from tests.servers import ServerProcess
from tests.spark_plugin import STREAM_POLL_INTERVAL
from txn import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.spark]

Change = tuple[int, int, str, str, int]


def changes(lh: Lakehouse, spark: SparkSession, start: int, end: int | None = None) -> list[Change]:
    got = lh.changes(spark, "events", start, end).collect()
    return sorted(
        (r["id"], r["amount"], r["day"], r["_change_type"], r["_commit_version"]) for r in got
    )


def rows(values: list[tuple[int, int, str]], kind: str, version: int) -> list[Change]:
    return sorted((i, a, d, kind, version) for i, a, d in values)


def make_table(lh: Lakehouse, spark: SparkSession) -> None:
    assert make_events(lh, spark) == 1


def test_each_kind_of_version_gives_exactly_its_changed_rows(
    lh: Lakehouse, spark: SparkSession
) -> None:
    make_table(lh, spark)  # versions 0 (creation: no row) and 1 (an append)
    # DELETE (2): the deleted row only, not d1's survivors 1 and 3 that it copied.
    assert lh.delete("events", "day = 'd1' AND amount < 0", spark=spark).version == 2
    # UPDATE (3): pre- and post-image of row 4; row 5 shares its file and is copied only.
    assert lh.update("events", {"amount": "amount * 2"}, "id = 4", spark=spark).version == 3
    # MERGE (4): an update, a delete and an insert; nothing for the rows it copied.
    source = spark.createDataFrame([(1, 100, "d1"), (3, -1, "d1"), (9, 9, "d3")], SCHEMA)
    result = (
        lh.merge("events", source, "target.id = source.id")
        .when_matched_delete("source.amount < 0")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    assert (result.version, result.rows_updated, result.rows_deleted) == (4, 1, 1)
    assert result.rows_inserted == 1
    # replaceWhere (5): the rows of the files it removed (all of d3), the rows it wrote.
    new_d3 = spark.createDataFrame([(7, 1, "d3")], SCHEMA)
    assert lh.overwrite("events", new_d3, replace_where="day = 'd3'") == 5
    # Whole-table overwrite (6): every row deleted, the new ones inserted.
    assert lh.overwrite("events", spark.createDataFrame([(10, 1, "d1")], SCHEMA)) == 6
    # A statement that changes nothing commits nothing: no version, no change.
    assert lh.delete("events", "id = 12345", spark=spark).version == 6

    by_version: dict[int, list[Change]] = {}
    for change in changes(lh, spark, 0):  # one read of the whole feed
        by_version.setdefault(change[4], []).append(change)
    assert by_version == {
        1: rows(ROWS, "insert", 1),
        2: rows([(2, -5, "d1")], "delete", 2),
        3: sorted(
            rows([(4, -1, "d2")], "update_preimage", 3)
            + rows([(4, -2, "d2")], "update_postimage", 3)
        ),
        4: sorted(
            rows([(1, 10, "d1")], "update_preimage", 4)
            + rows([(1, 100, "d1")], "update_postimage", 4)
            + rows([(3, 7, "d1")], "delete", 4)
            + rows([(9, 9, "d3")], "insert", 4)
        ),
        5: sorted(
            rows([(6, 8, "d3"), (9, 9, "d3")], "delete", 5) + rows([(7, 1, "d3")], "insert", 5)
        ),
        6: sorted(
            rows([(1, 100, "d1"), (4, -2, "d2"), (5, 3, "d2"), (7, 1, "d3")], "delete", 6)
            + rows([(10, 1, "d1")], "insert", 6)
        ),
    }
    assert changes(lh, spark, 3, 3) == by_version[3]  # one version alone

    # Plain reads and listings never see the change files the statements committed.
    assert all("part-cdc-" not in f.path for f in lh.files("events"))
    for commit in lh.history("events"):
        assert all("part-cdc-" not in p for p in (*commit.added_files, *commit.removed_files))
    assert sorted(r["id"] for r in lh.read(spark, "events", version=4).collect()) == [1, 4, 5, 6, 9]


def test_a_range_of_versions_with_their_numbers_and_commit_times(
    lh: Lakehouse, spark: SparkSession
) -> None:
    make_table(lh, spark)
    lh.delete("events", "id = 2", spark=spark)  # version 2
    lh.add_columns("events", "note STRING")  # version 3: a schema change, no rows
    lh.update("events", {"amount": "0"}, "id = 6", spark=spark)  # version 4

    df = lh.changes(spark, "events", 2)
    feed = ["_change_type", "_commit_version", "_commit_timestamp"]
    assert df.columns == ["id", "amount", "day", "note", *feed]
    expected = [
        (2, -5, "d1", "delete", 2),
        (6, 0, "d3", "update_postimage", 4),
        (6, 8, "d3", "update_preimage", 4),
    ]
    got = df.collect()
    assert sorted((r[0], r[1], r[2], r[4], r[5]) for r in got) == expected
    assert changes(lh, spark, 2, 3) == expected[:1]  # version 3 changed no row
    assert changes(lh, spark, 1, 99) == sorted(rows(ROWS, "insert", 1) + expected)  # capped

    times = {c.version: c.timestamp_ms for c in lh.history("events")}
    for r in got:
        assert r["note"] is None
        stamp = r["_commit_timestamp"].replace(tzinfo=None)
        expected_time = datetime.datetime.fromtimestamp(
            times[r["_commit_version"]] / 1000, datetime.UTC
        ).replace(tzinfo=None)
        assert abs(stamp - expected_time) < datetime.timedelta(hours=24)  # session zone
        assert stamp.microsecond // 1000 == expected_time.microsecond // 1000


def test_bad_ranges_missing_tables_and_expired_versions_are_named(
    lh: Lakehouse, spark: SparkSession
) -> None:
    with pytest.raises(TableNotFoundError, match="nope"):
        lh.changes(spark, "nope", 0)
    make_table(lh, spark)
    with pytest.raises(VersionNotFoundError, match="starting version 5 is after the latest"):
        lh.changes(spark, "events", 5)
    with pytest.raises(ValueError, match="ending_version 0 is before starting_version 1"):
        lh.changes(spark, "events", 1, 0)
    with pytest.raises(ValueError, match="must not be negative"):
        lh.changes(spark, "events", -1)
    with pytest.raises(TypeError, match="starting_version must be an int"):
        lh.changes(spark, "events", "1")  # type: ignore[arg-type]

    lh.delete("events", "id = 2", spark=spark)  # version 2, with its change files
    lh.set_retention("events", Retention(0, 0))
    lh.expire("events")
    with pytest.raises(VersionNotFoundError, match="version 1 is no longer readable"):
        lh.changes(spark, "events", 1)
    # Vacuum keeps the change files of the versions still readable.
    lh.vacuum("events", 0)
    assert changes(lh, spark, 2) == [(2, -5, "d1", "delete", 2)]


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)
def test_a_range_across_a_changed_column_type_is_refused_by_name(
    lh: Lakehouse, spark: SparkSession
) -> None:
    """An ``overwrite_schema`` that changes a column's type (not a widening) leaves older
    files that the new schema cannot read: a range across it is refused before any file
    is read, naming the column; the ranges on either side read fine."""
    make_table(lh, spark)
    changed = StructType(
        [StructField("id", LongType()), StructField("amount", StringType()), *SCHEMA[2:]]
    )
    replaced = spark.createDataFrame([(1, "ten", "d1")], changed)
    assert lh.overwrite("events", replaced, overwrite_schema=True) == 2
    for start in (0, 1, 2):
        with pytest.raises(ValueError, match="column 'amount' is bigint in the schema of"):
            lh.changes(spark, "events", start)
    assert changes(lh, spark, 0, 1) == rows(ROWS, "insert", 1)
    lh.append("events", spark.createDataFrame([(2, "two", "d2")], changed))  # version 3
    got = lh.changes(spark, "events", 3).collect()
    assert [(r["id"], r["amount"], r["_change_type"]) for r in got] == [(2, "two", "insert")]


def test_the_data_source_reads_the_feed_with_option_read_change_feed(
    spark: SparkSession, sqlite_gateway: ServerProcess, tmp_path: Path
) -> None:
    """``spark.read.format("percolake").option("readChangeFeed", "true")`` gives what
    ``lh.changes`` gives, pinned when the DataFrame is defined; ``readStream`` with the
    option follows the feed version by version."""
    register(spark)
    address = sqlite_gateway.address
    tm = TransactionManager.remote(address)
    try:
        lh = Lakehouse(tm, str(tmp_path / "warehouse"))  # the source's catalog
        make_table(lh, spark)
        lh.update("events", {"amount": "amount + 1"}, "id = 4", spark=spark)  # version 2
        lh.delete("events", "day = 'd3'", spark=spark)  # version 3

        def feed(**options: int) -> DataFrame:
            reader = spark.read.format("percolake").option("gateway", address)
            reader = reader.option("readChangeFeed", "true")
            for key, value in options.items():
                reader = reader.option(key, value)
            return reader.load("events")

        every = feed(startingVersion=1)
        kinds = [(f.name, f.dataType) for f in lh.changes(spark, "events", 1).schema]
        assert [(f.name, f.dataType) for f in every.schema] == kinds
        expected = sorted(map(tuple, lh.changes(spark, "events", 1).collect()))
        lh.delete("events", "id = 1", spark=spark)  # version 4: after the read was defined
        assert sorted(map(tuple, every.collect())) == expected
        two = sorted(map(tuple, feed(startingVersion=2, endingVersion=2).collect()))
        assert [r[1:5] for r in two] == [
            (-1, "d2", "update_preimage", 2),
            (0, "d2", "update_postimage", 2),
        ]
        latest = feed(startingVersion=4).collect()
        assert [(r["id"], r["_change_type"]) for r in latest] == [(1, "delete")]

        plain = spark.read.format("percolake").option("gateway", address)
        assert plain.option("readChangeFeed", "false").load("events").count() == 4
        with pytest.raises(Exception, match="needs option startingVersion"):
            feed()
        with pytest.raises(Exception, match="starting version 9 is after the latest"):
            feed(startingVersion=9)
        with pytest.raises(Exception, match="endingVersion 1 is before startingVersion 2"):
            feed(startingVersion=2, endingVersion=1)

        # A stream of the feed: every version from startingVersion on, then each new one.
        sdf = spark.readStream.format("percolake").option("gateway", address)
        sdf = sdf.option("readChangeFeed", "true").option("startingVersion", 3).load("events")
        query = (
            sdf.writeStream.format("memory")
            .queryName("feed_stream")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime=STREAM_POLL_INTERVAL)
            .start()
        )
        try:
            query.processAllAvailable()
            lh.update("events", {"amount": "0"}, "id = 5", spark=spark)  # version 5
            query.processAllAvailable()
            assert query.exception() is None
            got = spark.sql("select id, _change_type, _commit_version from feed_stream")
            assert sorted(map(tuple, got.collect())) == [
                (1, "delete", 4),
                (5, "update_postimage", 5),
                (5, "update_preimage", 5),
                (6, "delete", 3),
            ]
        finally:
            query.stop()
    finally:
        tm.close()


def test_a_change_feed_stream_honours_max_files_per_trigger(
    spark: SparkSession, sqlite_gateway: ServerProcess, tmp_path: Path
) -> None:
    """With ``maxFilesPerTrigger=1`` each micro-batch of the feed reads one version's
    files, all of them though there are several (a commit is never split, so an
    update's pre- and post-images arrive together), versions in order, and together
    the batches hold exactly the feed's rows; a batch read refuses the option."""
    register(spark)
    address = sqlite_gateway.address
    tm = TransactionManager.remote(address)
    name = "feed_limited"
    try:
        lh = Lakehouse(tm, str(tmp_path / "warehouse"))  # the source's catalog
        assert make_events(lh, spark, name) == 1  # version 1: a file per day
        lh.update(name, {"amount": "amount + 1"}, "id IN (1, 4)", spark=spark)  # 2: d1, d2
        lh.delete(name, "day = 'd3'", spark=spark)  # version 3
        with open_gateway(address) as catalog:
            files = change_files(plan_changes(catalog, name, 1, None))
        assert len(files) >= 6  # three data files, at least three change files

        batches: list[list[Row]] = []
        sdf = spark.readStream.format("percolake").option("gateway", address)
        sdf = sdf.option("readChangeFeed", "true").option("startingVersion", 1)
        sdf = sdf.option("maxFilesPerTrigger", 1).load(name)
        query = (
            sdf.writeStream.foreachBatch(lambda df, _: batches.append(df.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            query.processAllAvailable()
            assert query.exception() is None
        finally:
            query.stop()
        read = [b for b in batches if b]
        per_version = {
            v: sum(f.file.record_count for f in files if f.version == v) for v in (1, 2, 3)
        }
        assert [len(b) for b in read] == list(per_version.values())
        versions = [{r["_commit_version"] for r in b} for b in read]
        assert versions == [{1}, {2}, {3}]  # one version each, whole, in version order
        assert len([f for f in files if f.version == 2]) > 1  # the limit was below it
        update = [r["_change_type"] for r in read[1]]
        assert update.count("update_preimage") == update.count("update_postimage") == 2
        got = sorted(tuple(r) for b in read for r in b)
        assert got == sorted(map(tuple, lh.changes(spark, name, 1).collect()))

        batch = spark.read.format("percolake").option("gateway", address)
        batch = batch.option("readChangeFeed", "true").option("startingVersion", 1)
        with pytest.raises(Exception, match="maxFilesPerTrigger is for streaming reads"):
            batch.option("maxFilesPerTrigger", 1).load(name).collect()
    finally:
        tm.close()
