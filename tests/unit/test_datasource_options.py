"""The ``percolake`` data source's options: parsed, or refused with the option's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_integration.spark import filesystem
from spark_integration.spark.datasource.options import (
    DEFAULT_GATEWAY,
    parse_timestamp_ms,
    query_id_of_checkpoint,
    read_options,
    stream_read_options,
    stream_write_options,
    write_options,
)

pytestmark = pytest.mark.unit


def test_defaults_and_case_insensitive_names() -> None:
    opts = write_options({"path": "events", "TXNAPPID": "app", "txnVersion": "7"})
    assert opts.gateway == DEFAULT_GATEWAY
    assert (opts.app_id, opts.batch_id) == ("app", 7)
    assert opts.partition_by is None and not opts.create_if_missing
    read = read_options({"path": "events", "gateway": "a:1, b:2", "versionasof": "3"})
    assert (read.gateway, read.version, read.timestamp_ms) == ("a:1,b:2", 3, None)


def test_partition_columns_are_comma_separated() -> None:
    opts = write_options(
        {
            "path": "t",
            "partitionColumns": "day, region",
            "createIfMissing": "TRUE",
            "warehouse": "/w",
        }
    )
    assert opts.partition_by == ("day", "region")
    assert opts.create_if_missing and opts.warehouse == "/w"


@pytest.mark.parametrize(
    ("raw", "ms"),
    [
        ("1970-01-01T00:00:01Z", 1000),
        ("1970-01-01 00:00:01.250", 1250),  # naive: UTC, never local time
        ("1970-01-01T01:00:01+01:00", 1000),
        ("1970-01-02", 86_400_000),
    ],
)
def test_timestamps_are_iso_8601_and_utc_when_naive(raw: str, ms: int) -> None:
    assert parse_timestamp_ms(raw) == ms


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "no table given"),
        ({"path": "/abs/folder"}, "invalid table name"),
        ({"path": "t", "versionAsOf": "x"}, "versionAsOf must be a non-negative integer"),
        ({"path": "t", "versionAsOf": "1", "timestampAsOf": "2024-01-01"}, "not both"),
        ({"path": "t", "timestampAsOf": "soon"}, "timestampAsOf must be an ISO-8601"),
        (
            {"path": "t", "txnAppId": "a"},
            r"unknown option\(s\) \['txnAppId'\] \(txnAppId is for writes",
        ),
        ({"path": "t", "gateway": "h:1,,h:2"}, "gateway must be HOST:PORT"),
    ],
)
def test_bad_read_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_options(options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"path": "t", "txnVersion": "1"}, "go together"),
        ({"path": "t", "txnAppId": "", "txnVersion": "1"}, "txnAppId must not be empty"),
        ({"path": "t", "txnAppId": "a", "txnVersion": "1.5"}, "non-negative integer"),
        ({"path": "t", "createIfMissing": "1"}, "must be true or false"),
        ({"path": "t", "createIfMissing": "true"}, "needs option warehouse"),
        ({"path": "t", "partitionColumns": " , "}, "lists no column"),
        ({"path": "t", "timestampAsOf": "2024-01-01"}, "timestampAsOf is for reads"),
        ({"path": "t", "readChangeFeed": "true"}, "unknown option"),
    ],
)
def test_bad_write_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_options(options)


def test_a_stream_is_named_by_its_checkpoint_or_txn_app_id(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a checkpointLocation"):
        stream_write_options({"path": "t"})
    with pytest.raises(ValueError, match="txnVersion is for batch writes"):
        stream_write_options({"path": "t", "txnAppId": "a", "txnVersion": "1"})
    opts = stream_write_options({"path": "t", "checkpointLocation": str(tmp_path)})
    assert opts.app_id is None and opts.checkpoint == str(tmp_path)
    with pytest.raises(ValueError, match="cannot read the query id"):
        query_id_of_checkpoint(str(tmp_path))
    (tmp_path / "metadata").write_text(json.dumps({"id": "q-1"}) + "\n")
    assert query_id_of_checkpoint(str(tmp_path)) == "q-1"
    assert query_id_of_checkpoint(f"file:{tmp_path}") == "q-1"
    for foreign in ("hdfs://namenode/ckpt", "file:relative/ckpt"):
        with pytest.raises(ValueError, match=r"not a local path or s3a:// URL.*txnAppId"):
            query_id_of_checkpoint(foreign)


def test_a_checkpoint_on_s3_names_its_query(s3_bucket: str) -> None:
    """Spark may keep a query's checkpoint on S3 (``s3a://``, through hadoop-aws): the
    query id is read from its metadata object with the standard AWS settings."""
    with pytest.raises(ValueError, match="cannot read the query id"):
        query_id_of_checkpoint(f"s3a://{s3_bucket}/ckpt")
    filesystem.write_bytes(f"s3://{s3_bucket}/ckpt/metadata", b'{"id":"q-2"}\n')
    assert query_id_of_checkpoint(f"s3a://{s3_bucket}/ckpt") == "q-2"
    assert query_id_of_checkpoint(f"s3://{s3_bucket}/ckpt/") == "q-2"


def test_stream_read_options_default_to_the_snapshot_and_refuse_batch_options() -> None:
    opts = stream_read_options({"path": "t"})
    assert (opts.starting_version, opts.only_new, opts.max_files) == (None, False, None)
    assert not opts.skip_change_commits
    opts = stream_read_options(
        {
            "path": "t",
            "startingVersion": "3",
            "maxFilesPerTrigger": "2",
            "skipChangeCommits": "TRUE",
        }
    )
    assert (opts.starting_version, opts.max_files, opts.skip_change_commits) == (3, 2, True)
    assert stream_read_options({"path": "t", "startingversion": "latest"}).only_new
    with pytest.raises(ValueError, match="timestampAsOf is for batch reads"):
        stream_read_options({"path": "t", "timestampAsOf": "2024-01-01"})
    with pytest.raises(ValueError, match="maxFilesPerTrigger must be at least 1"):
        stream_read_options({"path": "t", "maxFilesPerTrigger": "0"})
    with pytest.raises(ValueError, match="startingVersion is for streaming reads"):
        read_options({"path": "t", "startingVersion": "1"})


def test_partition_overwrite_mode_is_a_batch_write_option() -> None:
    """Issue 30 item 7: the write option is parsed (any case) and checked, never ignored.
    Fails before the fix: it was refused as an unknown option."""
    assert write_options({"path": "t"}).partition_overwrite_mode is None
    for raw, mode in (("STATIC", "static"), (" dynamic ", "dynamic")):
        opts = write_options({"path": "t", "partitionOverwriteMode": raw})
        assert opts.partition_overwrite_mode == mode
    with pytest.raises(ValueError, match="partitionOverwriteMode must be static or dynamic"):
        write_options({"path": "t", "partitionOverwriteMode": "replace"})
    with pytest.raises(ValueError, match="partitionOverwriteMode is for batch writes"):
        read_options({"path": "t", "partitionOverwriteMode": "static"})
    with pytest.raises(ValueError, match="unknown option"):
        stream_write_options({"path": "t", "txnAppId": "a", "partitionOverwriteMode": "static"})
