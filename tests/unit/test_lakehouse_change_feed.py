"""The change data feed's pieces that need no Spark: how a DML version records its change
files, which commits may carry them, the feed's version arguments and the data source's
``readChangeFeed`` options."""

from __future__ import annotations

import pytest

from spark_integration.engine import Catalog, CommitRequest
from spark_integration.engine.model import APPEND, DELETE, FileEntry, LogRecord, TableMeta
from spark_integration.engine.read_set import ReadSet
from spark_integration.spark.changes import check_versions
from spark_integration.spark.datasource.options import change_feed_options, read_options
from txn import TransactionManager

pytestmark = pytest.mark.unit

CHANGE = FileEntry("_lh_job=j/day=d1/part-cdc-0.parquet", 10, 2, {"day": "d1"})


def test_a_log_record_keeps_its_change_files_and_older_records_read_without() -> None:
    record = LogRecord(3, DELETE, 1000, 2, 1, "j", None, None, 7, (CHANGE,))
    assert LogRecord.decode(record.encode()) == record
    plain = LogRecord(4, APPEND, 1001, 2, 1, "k", None, None, 8)
    assert b'"cd"' not in plain.encode()  # records of other versions are unchanged
    assert LogRecord.decode(plain.encode()).changes == ()


def test_only_dml_statements_commit_change_files() -> None:
    tm = TransactionManager.embedded("memory://")
    try:
        catalog = Catalog(tm, "c")
        catalog.create(TableMeta("t", "{}", ("day",), "/w/t", 1), job_id="create")
        data = FileEntry("_lh_job=j/day=d1/part-0.parquet", 10, 2, {"day": "d1"})
        catalog.commit_files("t", APPEND, [data], job_id="j", job_started_ms=2)
        with pytest.raises(ValueError, match="WRITE has no change files"):
            catalog.commit_files(
                "t", APPEND, [data], job_id="k", job_started_ms=2, change_files=[CHANGE]
            )
        committed = catalog.commit_files(
            "t",
            DELETE,
            [],
            job_id="d",
            job_started_ms=2,
            read_set=ReadSet(1, (data.path,), ()),
            change_files=[CHANGE],
        )
        (entry,) = [h for h in catalog.history("t") if h.record.version == committed.version]
        assert entry.record.changes == (CHANGE,)
        assert catalog.files("t", None, FileEntry)[2] == []  # never listed as a table file
        assert CommitRequest(DELETE, (), "x", 0, change_files=(CHANGE,)).size_bytes() > 256 + 64
    finally:
        tm.close()


def test_the_feed_version_arguments_are_checked() -> None:
    assert check_versions(2, None) == (2, None)
    assert check_versions(2, 2) == (2, 2)
    with pytest.raises(ValueError, match="ending_version 1 is before starting_version 2"):
        check_versions(2, 1)
    with pytest.raises(TypeError, match="starting_version must be an int"):
        check_versions(True, None)
    with pytest.raises(ValueError, match="ending_version must not be negative"):
        check_versions(0, -1)


def test_read_change_feed_options() -> None:
    assert change_feed_options({"path": "t"}) is None
    assert change_feed_options({"path": "t", "readChangeFeed": "false"}) is None
    assert read_options({"path": "t", "readChangeFeed": "false"}).version is None
    opts = change_feed_options(
        {"path": "t", "READCHANGEFEED": "True", "startingVersion": "2", "endingVersion": "5"}
    )
    assert opts is not None and (opts.table, opts.starting_version, opts.ending_version) == (
        "t",
        2,
        5,
    )
    for bad, message in [
        ({"readChangeFeed": "yes"}, "readChangeFeed must be true or false"),
        ({"readChangeFeed": "true"}, "needs option startingVersion"),
        ({"readChangeFeed": "true", "startingVersion": "x"}, "non-negative integer"),
        (
            {"readChangeFeed": "true", "startingVersion": "3", "endingVersion": "2"},
            "endingVersion 2 is before startingVersion 3",
        ),
        (
            {"readChangeFeed": "true", "startingVersion": "3", "versionAsOf": "1"},
            r"unknown option\(s\) \['versionAsOf'\]",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            change_feed_options({"path": "t", **bad})
    with pytest.raises(ValueError, match="readChangeFeed is for change feed reads"):
        read_options({"path": "t", "readChangeFeed": "true"})
