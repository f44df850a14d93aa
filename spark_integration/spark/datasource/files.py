"""The executor side of the ``percolake`` data source: Parquet in and out with pyarrow.

Writes go into a job folder (``<location>/_lh_job=<id>/``, see ``_hook.new_job``),
Hive-partitioned by the table's partition columns exactly as Spark lays them out
(``col=value/``, ``__HIVE_DEFAULT_PARTITION__`` for null and for the empty string,
partition columns not stored in the files), so ``Lakehouse.read`` and this module read
each other's files. Reads
take a pinned list of files and never list a folder: files no version names (a
running or failed job's) are never read.

Paths are locations (a local path or ``s3://bucket/key``) and every byte goes
through ``spark.filesystem``: on S3 each file is one object, uploaded by pyarrow and
visible only once complete (a task that dies mid-upload leaves at most an unfinished
multipart upload, which no listing shows). Files are written where they stay: nothing
is renamed, on any store. The S3 client of a task is built from the AWS variables of
the executor's environment (see ``filesystem``): executors need the same settings as
the driver.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from spark_integration.engine.locations import is_object_store, relative_to
from spark_integration.engine.model import FileEntry, FileStats
from spark_integration.spark import filesystem
from spark_integration.spark.file_stats import file_stats
from spark_integration.spark.hook import parse_partition

# pyarrow is imported in the functions that use it: Spark imports this module in every
# Python worker it starts to plan a read or a write, which touches no file, and pyarrow
# with pyarrow.dataset (which imports pandas) cost those workers about 1 CPU-s each.

#: Row groups of at most this many rows (Spark's writer makes groups of ~128 MB; for
#: narrow rows this is about that, and readers can still skip groups by statistics).
MAX_ROWS_PER_GROUP = 1 << 20
#: Small input batches are gathered into groups of at least this many rows.
MIN_ROWS_PER_GROUP = 1 << 16
#: Batches handed back to Spark on reads.
READ_BATCH_ROWS = 1 << 16


@dataclass(frozen=True, slots=True)
class FileToRead:
    """One file of a pinned snapshot: absolute path, partition values, rows, statistics."""

    path: str
    size_bytes: int
    partition: dict[str, str | None]
    record_count: int
    stats: FileStats | None = None


def write_batches(
    batches: Iterator[Any],
    *,
    location: str,
    staging: str,
    columns: Sequence[str],
    partition_by: Sequence[str],
    tag: str,
    dictionary: Sequence[str] | None = None,
) -> list[FileEntry]:
    """Write Arrow record batches as Parquet files under ``staging``; describe each file
    (path, size, row count, partition values and column statistics, from its footer).
    ``dictionary``: the columns to dictionary-encode (default: every column, pyarrow's).

    ``columns`` is the table's column order; the batches carry the same names in
    any order. Paths in the returned entries are relative to ``location``; files
    with no rows are not written at all. ``tag`` makes the file names of this task
    unique in the job folder (a retried task writes files of its own).
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    first = next(batches, None)
    if first is None:
        return []
    schema = pa.schema([first.schema.field(name) for name in columns])

    def ordered() -> Iterator[Any]:
        for batch in chain([first], batches):
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays(
                    [
                        _default_partition(batch.column(name))
                        if name in partition_by
                        else batch.column(name)
                        for name in columns
                    ],
                    schema=schema,
                )

    partitioning = (
        ds.partitioning(pa.schema([schema.field(c) for c in partition_by]), flavor="hive")
        if partition_by
        else None
    )
    written: list[FileEntry] = []
    fs, fs_staging = filesystem.resolve(staging)
    job_folder = _job_folder(location, staging)

    def visit(written_file: Any) -> None:
        # pyarrow reports paths within its file system (no scheme on S3): the part
        # below the staging folder is the same on every store.
        inside = str(written_file.path)[len(fs_staging) :].lstrip("/")
        folder = posixpath.dirname(inside)
        partition = parse_partition(folder, tuple(partition_by))
        written.append(
            _entry(job_folder, inside, written_file.size, written_file.metadata, partition)
        )

    ds.write_dataset(
        ordered(),
        fs_staging,
        filesystem=fs,
        # S3 has no folders: creating one would only add empty marker objects.
        create_dir=not is_object_store(staging),
        schema=schema,
        format="parquet",
        file_options=None
        if dictionary is None
        else ds.ParquetFileFormat().make_write_options(use_dictionary=list(dictionary)),
        partitioning=partitioning,
        basename_template=f"part-{tag}-{uuid.uuid4().hex[:12]}-{{i}}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=visit,
        min_rows_per_group=MIN_ROWS_PER_GROUP,
        max_rows_per_group=MAX_ROWS_PER_GROUP,
    )
    return [f for f in written if f.record_count > 0]


def write_table(
    table: Any,
    *,
    location: str,
    staging: str,
    columns: Sequence[str],
    tag: str,
    dictionary: Sequence[str] | None = None,
) -> list[FileEntry]:
    """``table`` (an Arrow table of an *unpartitioned* table's rows) as one Parquet file
    in ``staging``, named and described as :func:`write_batches` names and describes
    its files (none without rows). The same file format options (pyarrow's defaults:
    snappy, statistics of every column, ``dictionary`` as there), row groups of at most
    :data:`MAX_ROWS_PER_GROUP` rows; without the dataset writer's machinery, which costs
    a third more than the encoding itself for one in-memory table (the MERGE benchmark's
    files of 100k rows: 30 ms against 20 ms of CPU each)."""
    import pyarrow.parquet as pq

    if not table.num_rows:
        return []
    job_folder = _job_folder(location, staging)
    table = table.select(list(columns))
    fs, fs_staging = filesystem.resolve(staging)
    if not is_object_store(staging):
        fs.create_dir(fs_staging, recursive=True)
    name = f"part-{tag}-{uuid.uuid4().hex[:12]}-0.parquet"
    footers: list[Any] = []
    with fs.open_output_stream(posixpath.join(fs_staging, name)) as out:
        with pq.ParquetWriter(
            out,
            table.schema,
            use_dictionary=True if dictionary is None else list(dictionary),
            metadata_collector=footers,
        ) as writer:
            writer.write_table(table, row_group_size=MAX_ROWS_PER_GROUP)
        size = out.tell()
    (footer,) = footers
    return [_entry(job_folder, name, size, footer, {})]


def _job_folder(location: str, staging: str) -> str:
    """``staging`` relative to the table's ``location``: where written files are named."""
    job_folder = relative_to(location, staging)
    if job_folder is None:
        raise ValueError(f"staging folder {staging!r} is not inside table location {location!r}")
    return job_folder


def _entry(
    job_folder: str, inside: str, size: int, footer: Any, partition: dict[str, str | None]
) -> FileEntry:
    """The entry of a file written ``inside`` the job folder, described by its footer."""
    return FileEntry(
        path=posixpath.join(job_folder, inside),
        size_bytes=int(size),
        record_count=int(footer.num_rows),
        partition=partition,
        stats=file_stats(footer) or None,
    )


def _default_partition(values: Any) -> Any:
    """A partition column with empty strings made null, as Spark and Delta store them.

    Spark writes both to the default partition (``__HIVE_DEFAULT_PARTITION__``) and
    reads them back as null; a ``col=`` folder, which pyarrow would write for ``''``,
    fails every Spark read of the table (``EMPTY_PARTITION_COLUMN_VALUE``). So one
    encoding serves both write paths (this one and the commit hook's Spark writer).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return values
    empty = pc.equal(values, pa.scalar("", values.type))
    return pc.if_else(empty, pa.scalar(None, values.type), values)


def _constant(value: str | None, kind: Any, rows: int) -> Any:
    import pyarrow as pa

    if value is None:
        return pa.nulls(rows, kind)
    return pa.repeat(pa.array([value], pa.string()).cast(kind)[0], rows)


def read_files(
    files: Sequence[FileToRead], target: Any, partition_by: Sequence[str]
) -> Iterator[Any]:
    """The rows of ``files`` as record batches of the Arrow schema ``target``.

    Data columns come from the files (cast to the table's types: Spark and pyarrow
    may store a type differently), partition columns from each file's recorded
    values, as Spark would parse them from the folder names. A column a file lacks
    (written before ``add_columns`` or ``mergeSchema`` added it) reads as NULL.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_columns = [f.name for f in target if f.name not in partition_by]
    for item in files:
        fs, fs_path = filesystem.resolve(item.path)
        with fs.open_input_file(fs_path) as source:
            # pre_buffer: one ranged GET per run of column chunks, not one per page.
            parquet = pq.ParquetFile(source, pre_buffer=True)
            present = set(parquet.schema_arrow.names)
            table = parquet.read(columns=[c for c in data_columns if c in present])
        rows = table.num_rows
        if not rows:
            continue
        arrays = [
            _constant(item.partition.get(f.name), f.type, rows)
            if f.name in partition_by
            else table.column(f.name).cast(f.type)
            if f.name in present
            else pa.nulls(rows, f.type)
            for f in target
        ]
        yield from pa.Table.from_arrays(arrays, schema=target).to_batches(READ_BATCH_ROWS)


def split_files(
    files: Sequence[FileToRead], target_bytes: int, min_splits: int
) -> list[list[FileToRead]]:
    """Files grouped into read tasks of about ``target_bytes`` each (greedy, largest first).

    At least ``min_splits`` groups while there are that many files, so a small table
    still reads in parallel; never an empty group.
    """
    if not files:
        return []
    total = sum(f.size_bytes for f in files)
    count = max(min(min_splits, len(files)), -(-total // max(target_bytes, 1)))
    count = min(count, len(files))
    groups: list[list[FileToRead]] = [[] for _ in range(count)]
    loads = [0] * count
    for item in sorted(files, key=lambda f: f.size_bytes, reverse=True):
        smallest = loads.index(min(loads))
        groups[smallest].append(item)
        loads[smallest] += item.size_bytes
    return [g for g in groups if g]
