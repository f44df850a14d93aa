"""``Lakehouse.rewrite_files``: copy-on-write changes made without Spark (issue 26).

The chaos workload deletes rows and compacts files in client processes that run no
Spark: it reads Parquet with pyarrow, writes the survivors, and commits through this
entry point, which builds the read set DML commits with. These tests run it embedded
and through a gateway (``lh``): a delete and a compaction commit, a delete that lost a
race to a compaction commits nothing, a compaction beside an append both commit, and
bad input fails naming the problem with nothing committed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import LongType, StructField, StructType

from spark_integration import ConcurrentModificationError, DataFile, Lakehouse
from spark_integration.engine.locations import join
from spark_integration.engine.model import ColumnStats
from spark_integration.spark import filesystem
from spark_integration.spark.hook import new_job

pytestmark = pytest.mark.integration

SCHEMA = StructType([StructField("id", LongType())])


def write(lh: Lakehouse, ids: list[int]) -> DataFile:
    """One Parquet file of ``ids`` in a fresh job folder of table ``t``, with stats."""
    job = new_job(join(lh.warehouse, "t"))
    filesystem.make_dirs(job.staging)
    path = join(job.staging, "part-00000.parquet")
    fs, fs_path = filesystem.resolve(path)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), fs_path, filesystem=fs)
    stats = {"id": ColumnStats(0, min(ids), max(ids))} if ids else None
    return DataFile(path, filesystem.file_size(path), len(ids), stats=stats)


def rows(lh: Lakehouse, version: int | None = None) -> list[int]:
    return sorted(
        i
        for f in lh.files("t", version)
        for i in filesystem.parquet_file(f.path).read().column("id").to_pylist()
    )


def test_a_delete_and_a_compaction_commit_and_change_what_they_say(lh: Lakehouse) -> None:
    lh.create_table("t", SCHEMA)
    a, b, c = (write(lh, ids) for ids in ([1, 2, 3], [4, 5], [6]))
    for f in (a, b, c):
        lh.append_files("t", [f])
    survivors = write(lh, [1, 3])
    deleted = lh.rewrite_files("t", 3, [a.path], [survivors], predicate="id IN (2)")
    assert deleted == 4 and rows(lh) == [1, 3, 4, 5, 6]
    merged = write(lh, [1, 3, 4, 5])
    compacted = lh.rewrite_files(
        "t", deleted, [survivors.path, b.path], [merged], operation="OPTIMIZE"
    )
    assert compacted == 5 and rows(lh) == rows(lh, 4) == [1, 3, 4, 5, 6]
    assert sorted(f.path for f in lh.files("t")) == sorted([c.path, merged.path])
    history = lh.history("t")
    assert [h.operation for h in history[-2:]] == ["DELETE", "OPTIMIZE"]
    assert history[-1].added_files == (merged.path,)
    assert set(history[-1].removed_files) == {survivors.path, b.path}
    assert rows(lh, 3) == [1, 2, 3, 4, 5, 6]  # time travel before the delete


def test_a_delete_that_read_a_file_a_compaction_removed_commits_nothing(lh: Lakehouse) -> None:
    lh.create_table("t", SCHEMA)
    a, b = write(lh, [1, 2]), write(lh, [3])
    lh.append_files("t", [a])
    read = lh.append_files("t", [b])
    lh.rewrite_files("t", read, [a.path, b.path], [write(lh, [1, 2, 3])], operation="OPTIMIZE")
    with pytest.raises(ConcurrentModificationError, match="rewritten or removed"):
        lh.rewrite_files("t", read, [a.path], [write(lh, [1])], predicate="id = 2")
    assert lh.version("t") == 3 and rows(lh) == [1, 2, 3]


def test_a_compaction_and_a_delete_beside_appends_commit(lh: Lakehouse) -> None:
    """Appends of other rows since the read: a compaction never conflicts with them, a
    delete whose predicate their statistics rule out does not either."""
    lh.create_table("t", SCHEMA)
    a, b = write(lh, [1, 2]), write(lh, [3, 4])
    lh.append_files("t", [a])
    read = lh.append_files("t", [b])
    lh.append_files("t", [write(lh, [10, 11])])
    version = lh.rewrite_files("t", read, [a.path], [write(lh, [2])], predicate="id IN (1)")
    lh.append_files("t", [write(lh, [20])])
    lh.rewrite_files("t", version, [b.path], [write(lh, [3, 4])], operation="OPTIMIZE")
    assert rows(lh) == [2, 3, 4, 10, 11, 20]
    before = lh.version("t")
    lh.append_files("t", [write(lh, [1])])
    target = [f.path for f in lh.files("t", before) if f.record_count == 2]
    with pytest.raises(ConcurrentModificationError, match="may hold rows matching"):
        # The file added since holds id 1: a delete of id 1 must not leave it out.
        lh.rewrite_files("t", before, target, [], predicate="id IN (1, 4)")
    assert lh.version("t") == before + 1


def test_bad_rewrites_fail_naming_the_problem_and_commit_nothing(lh: Lakehouse) -> None:
    lh.create_table("t", SCHEMA)
    a = write(lh, [1])
    version = lh.append_files("t", [a])
    new = [write(lh, [])]
    with pytest.raises(ValueError, match="operation must be one of"):
        lh.rewrite_files("t", version, [a.path], new, operation="MERGE")
    with pytest.raises(ValueError, match="is not a file of version 1"):
        lh.rewrite_files("t", version, [a.path + ".x"], new)
    with pytest.raises(ValueError, match="at least one file"):
        lh.rewrite_files("t", version, [], new)
    with pytest.raises(ValueError, match="more than once"):
        lh.rewrite_files("t", version, [a.path, a.path], new)
    with pytest.raises(ValueError, match="not in a job folder"):
        lh.rewrite_files("t", version, [a.path], [DataFile("/elsewhere/x.parquet", 1, 1)])
    assert lh.version("t") == version
