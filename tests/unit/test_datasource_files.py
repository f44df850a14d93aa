"""The data source's Parquet writer: partition folders laid out as Spark lays them out."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from spark_integration.spark.datasource.files import FileToRead, read_files, write_batches

pytestmark = pytest.mark.unit


def test_empty_and_null_partition_values_go_to_the_default_partition(tmp_path: Path) -> None:
    """Issue 30 item 6. Fails before the fix: ``''`` was written to a ``day=`` folder
    (which every Spark read of the table refuses, ``EMPTY_PARTITION_COLUMN_VALUE``) and
    recorded apart from NULL. Spark and Delta store both as the default partition."""
    batch = pa.RecordBatch.from_pydict(
        {"id": [0, 1, 2, 3], "day": ["", None, "d2", ""]},
        schema=pa.schema([("id", pa.int64()), ("day", pa.string())]),
    )
    entries = write_batches(
        iter([batch]),
        location=str(tmp_path),
        staging=str(tmp_path / "_lh_job=x"),
        columns=("id", "day"),
        partition_by=("day",),
        tag="t",
    )
    folders = {Path(e.path).parent.name: e.partition for e in entries}
    assert folders == {"day=__HIVE_DEFAULT_PARTITION__": {"day": None}, "day=d2": {"day": "d2"}}
    assert sorted(e.record_count for e in entries) == [1, 3]
    files = [FileToRead(str(tmp_path / e.path), e.size_bytes, e.partition, 0) for e in entries]
    rows = [
        row
        for got in read_files(files, batch.schema, ("day",))
        for row in zip(got.column(0).to_pylist(), got.column(1).to_pylist(), strict=True)
    ]
    assert sorted(rows) == [(0, None), (1, None), (2, "d2"), (3, None)]
