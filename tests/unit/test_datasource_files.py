"""The data source's Parquet writer: partition folders laid out as Spark lays them out,
on a local folder and on S3 (the session's MinIO)."""

from __future__ import annotations

import posixpath

import pyarrow as pa
import pytest

from spark_integration.engine.locations import join
from spark_integration.spark import filesystem
from spark_integration.spark.datasource.files import FileToRead, read_files, write_batches

pytestmark = pytest.mark.unit


@pytest.fixture
def location(warehouse: str) -> str:
    """A table location in a fresh warehouse: local, or on the session's MinIO."""
    return join(warehouse, "t")


def test_empty_and_null_partition_values_go_to_the_default_partition(location: str) -> None:
    """Issue 30 item 6. Fails before the fix: ``''`` was written to a ``day=`` folder
    (which every Spark read of the table refuses, ``EMPTY_PARTITION_COLUMN_VALUE``) and
    recorded apart from NULL. Spark and Delta store both as the default partition."""
    batch = pa.RecordBatch.from_pydict(
        {"id": [0, 1, 2, 3], "day": ["", None, "d2", ""]},
        schema=pa.schema([("id", pa.int64()), ("day", pa.string())]),
    )
    entries = write_batches(
        iter([batch]),
        location=location,
        staging=join(location, "_lh_job=x"),
        columns=("id", "day"),
        partition_by=("day",),
        tag="t",
    )
    folders = {posixpath.dirname(e.path): e.partition for e in entries}
    assert folders == {
        "_lh_job=x/day=__HIVE_DEFAULT_PARTITION__": {"day": None},
        "_lh_job=x/day=d2": {"day": "d2"},
    }
    assert sorted(e.record_count for e in entries) == [1, 3]
    # The entries describe the stored files exactly: the only files below the table.
    stored = filesystem.list_files(location)
    assert sorted((join(location, e.path), e.size_bytes) for e in entries) == [
        (f.path, f.size) for f in stored
    ]
    files = [FileToRead(join(location, e.path), e.size_bytes, e.partition, 0) for e in entries]
    rows = [
        row
        for got in read_files(files, batch.schema, ("day",))
        for row in zip(got.column(0).to_pylist(), got.column(1).to_pylist(), strict=True)
    ]
    assert sorted(rows) == [(0, None), (1, None), (2, "d2"), (3, None)]
