"""Column statistics of data files: from Parquet footers into the log, and back.

Records written before statistics existed (no ``st`` in a file row, four-element
checkpoint chunks, no ``stats_json`` on the wire) must still read, as ``None``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import LongType, StringType, StructField, StructType

import spark_integration.engine.checkpoints as checkpoints_module
from spark_integration import DataFile, Lakehouse
from spark_integration.engine.model import (
    ColumnStats,
    FileEntry,
    Layout,
    decode_chunk,
    decode_file,
    decode_stats,
    encode_chunk,
    encode_stats,
)
from spark_integration.service.convert import entry_from_pb, entry_to_pb
from spark_integration.spark.datasource.files import write_batches
from spark_integration.spark.file_stats import MAX_STAT_CHARS, file_stats
from spark_integration.spark.hook import STAGING_PREFIX
from txn import TransactionManager
from wire.v1 import lakehouse_pb2 as pb

pytestmark = pytest.mark.unit

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
STATS = {"id": ColumnStats(0, 1, 9), "name": ColumnStats(2, "a", "zz")}


def _footer(tmp_path: Path, table: pa.Table, row_group_size: int) -> object:
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=row_group_size)
    return pq.read_metadata(path)


# --- from the footer ------------------------------------------------------------------


def test_stats_are_the_union_of_the_row_groups(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": pa.array([5, 3, None, 9, 1, 7], pa.int64()),
            "name": pa.array(["m", None, "b", "x", None, "c"], pa.string()),
            "flag": pa.array([False, False, True, False, None, False]),
            "day": pa.array([datetime.date(2024, 1, d) for d in (3, 9, 1, 2, 5, 4)]),
        }
    )
    stats = file_stats(_footer(tmp_path, table, row_group_size=2))  # three row groups
    assert stats == {
        "id": ColumnStats(1, 1, 9),
        "name": ColumnStats(2, "b", "x"),
        "flag": ColumnStats(1, False, True),
        "day": ColumnStats(0, "2024-01-01", "2024-01-09"),
    }


def test_uncertain_bounds_are_left_out(tmp_path: Path) -> None:
    table = pa.table(
        {
            # NaN is not in Parquet's float bounds: they cannot bound a filter.
            "score": pa.array([1.5, float("nan"), None]),
            "long": pa.array(["a" * (MAX_STAT_CHARS + 1), "b", "c"]),
            "none": pa.array([None, None, None], pa.int64()),
            "nested": pa.array([{"x": 1}, {"x": 2}, None]),
            "ok": pa.array(["a" * MAX_STAT_CHARS, "b", "c"]),
        }
    )
    stats = file_stats(_footer(tmp_path, table, row_group_size=3))
    assert stats["score"] == ColumnStats(1, None, None)
    assert stats["long"] == ColumnStats(0, None, None)
    assert stats["none"] == ColumnStats(3, None, None)
    assert stats["ok"] == ColumnStats(0, "a" * MAX_STAT_CHARS, "c")
    assert "nested" not in stats and "nested.x" not in stats


def test_the_data_source_writer_records_stats_of_each_file(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("day", pa.string())])
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1, 2, 3, 40, None]), pa.array(["d1", "d1", "d2", "d2", "d2"])], schema=schema
    )
    location = tmp_path / "t"
    staging = location / f"{STAGING_PREFIX}job"
    files = write_batches(
        iter([batch]),
        location=str(location),
        staging=str(staging),
        columns=["id", "day"],
        partition_by=["day"],
        tag="00000-0",
    )
    by_day = {f.partition["day"]: f for f in files}
    assert set(by_day) == {"d1", "d2"}
    # Partition columns are not in the files, so they have no statistics.
    assert by_day["d1"].stats == {"id": ColumnStats(0, 1, 2)}
    assert by_day["d2"].stats == {"id": ColumnStats(1, 3, 40)}
    assert by_day["d2"].record_count == 3


# --- in the log and on the wire -------------------------------------------------------


def test_entries_round_trip_with_and_without_stats() -> None:
    with_stats = FileEntry("j/a.parquet", 10, 3, {"day": "d1"}, STATS)
    without = FileEntry("j/b.parquet", 11, 4, {"day": None})
    for entry in (with_stats, without):
        assert FileEntry.decode(entry.encode()) == entry
        assert entry_from_pb(entry_to_pb(entry)) == entry
    assert decode_chunk(encode_chunk([with_stats, without]), FileEntry) == [with_stats, without]
    assert b'"st"' not in without.encode()  # no statistics, not one byte more


def test_records_written_before_stats_existed_still_read() -> None:
    old_row = b'{"p":"j/a.parquet","s":10,"n":3,"pv":{"day":"d1"}}'
    assert decode_file(old_row, FileEntry) == FileEntry("j/a.parquet", 10, 3, {"day": "d1"})
    old_chunk = json.dumps([["j/a.parquet", 10, 3, {"day": "d1"}], ["j/b.parquet", 1, 1, None]])
    assert decode_chunk(old_chunk.encode(), FileEntry) == [
        FileEntry("j/a.parquet", 10, 3, {"day": "d1"}),
        FileEntry("j/b.parquet", 1, 1, {}),
    ]
    old_wire = pb.FileEntry(path="j/a.parquet", size_bytes=10, record_count=3)
    assert entry_from_pb(old_wire).stats is None


@pytest.mark.parametrize(
    "text",
    ["{", "[1]", '{"id": [1, 2]}', '{"id": ["x", 1, 2]}', '{"id": [1, [1], 2]}'],
)
def test_malformed_stats_from_a_client_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"statistics|null count|min/max"):
        decode_stats(text)
    assert decode_stats(encode_stats(STATS)) == STATS
    assert encode_stats(None) == "" and decode_stats("") is None


@pytest.fixture
def lh(tmp_path: Path) -> Iterator[Lakehouse]:
    tm = TransactionManager.embedded("memory://")
    house = Lakehouse(tm, tmp_path / "warehouse")
    house.create_table("t", SCHEMA, partition_by="day")
    yield house
    tm.close()


def test_committed_stats_list_back_from_rows_and_checkpoints(
    lh: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "EARLY_CHECKPOINT_INTERVAL", 3)
    monkeypatch.setattr(checkpoints_module, "CHUNK_FILES", 2)
    expected: list[DataFile] = []
    for n in range(1, 6):
        path = f"{lh.warehouse}/t/{STAGING_PREFIX}j{n}/day=d1/part-{n}.parquet"
        # Every other file has no statistics (a writer that collects none).
        stats = {"id": ColumnStats(0, n, 10 * n)} if n % 2 else None
        expected.append(DataFile(path, 100 + n, n, {"day": "d1"}, stats))
        lh.append_files("t", [expected[-1]])
    # Version 3 was packed into a checkpoint: its files list from chunk cells.
    tm = lh._tm
    with tm.begin() as tx:
        layout = Layout("lakehouse")
        assert any(True for _ in tx.scan(layout.checkpoints))
    assert lh.files("t") == expected
    assert lh.files("t", version=3) == expected[:3]
    assert [tuple(c.added_files) for c in lh.history("t")[1:]] == [(f.path,) for f in expected]
