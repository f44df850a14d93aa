"""The data source's Parquet writer: partition folders laid out as Spark lays them out,
on a local folder and on S3 (the session's MinIO)."""

from __future__ import annotations

import posixpath
import re
import subprocess
import sys

import pyarrow as pa
import pytest

from spark_integration.engine.locations import join
from spark_integration.spark import filesystem
from spark_integration.spark.datasource.files import (
    FileToRead,
    read_files,
    write_batches,
    write_table,
)

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


def test_write_table_writes_the_file_write_batches_writes(location: str) -> None:
    """``write_table`` (MERGE's writer of one in-memory table) against ``write_batches``
    on the same rows: the same name scheme, entry shape and statistics (pruning reads
    them), the same Parquet schema and encodings, the same rows read back; no rows, no
    file."""
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("x", pa.float64())])
    table = pa.table(
        {"x": [0.5, None, 2.0, 1.0], "id": [3, None, 1, 7], "s": ["b", "a", None, "b"]}
    )
    columns = ("id", "s", "x")
    by_batches = write_batches(
        iter(table.to_batches()),
        location=location,
        staging=join(location, "_lh_job=a"),
        columns=columns,
        partition_by=(),
        tag="00001-0",
        dictionary=["s"],
    )
    by_table = write_table(
        table,
        location=location,
        staging=join(location, "_lh_job=b"),
        columns=columns,
        tag="00001-0",
        dictionary=["s"],
    )
    assert len(by_batches) == len(by_table) == 1
    a, b = by_batches[0], by_table[0]
    assert re.fullmatch(r"_lh_job=b/part-00001-0-[0-9a-f]{12}-0\.parquet", b.path)
    assert (b.size_bytes, b.record_count, b.partition, b.stats) == (
        a.size_bytes,
        a.record_count,
        a.partition,
        a.stats,
    )
    assert b.stats is not None and b.stats["id"].max_value == 7
    stored = {f.path: f.size for f in filesystem.list_files(location)}
    assert stored[join(location, b.path)] == b.size_bytes
    footers = [filesystem.parquet_metadata(join(location, e.path)) for e in (a, b)]
    assert footers[0].schema.equals(footers[1].schema)
    assert [footers[0].row_group(0).column(j).encodings for j in range(3)] == [
        footers[1].row_group(0).column(j).encodings for j in range(3)
    ]
    files = [FileToRead(join(location, e.path), e.size_bytes, {}, 0) for e in (a, b)]
    read = [pa.Table.from_batches(list(read_files([f], schema, ())), schema) for f in files]
    assert read[0].equals(read[1]) and read[1].to_pydict() == table.select(columns).to_pydict()
    empty = write_table(
        table.slice(0, 0),
        location=location,
        staging=join(location, "_lh_job=c"),
        columns=columns,
        tag="0",
    )
    assert empty == []


def test_planning_a_read_or_write_imports_neither_pyarrow_nor_pandas() -> None:
    """Spark plans every read and write of the data source in a Python worker forked
    for that one call, which imports the data source module: with pyarrow and
    pyarrow.dataset (which imports pandas) at the top of ``files`` and ``filesystem``,
    that import took about 1.3 s of each call, half of it theirs. Only the tasks that
    write or read files import them."""
    code = (
        "import sys\n"
        "import spark_integration.spark.datasource.source\n"
        "print(sorted(m for m in ('pyarrow', 'pandas', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout
