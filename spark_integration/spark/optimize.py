"""Compaction (``Lakehouse.optimize``): small files rewritten into fewer, no row changed.

Every append writes at least one file per task and partition, so a table fed by
small appends piles up small files, and each costs a file row at every listing and
an open at every read. Compaction runs in four steps:

1. **Check** (:func:`target_bytes`, :func:`partition_conditions`): the target size is
   a positive number of MB; a predicate may name partition columns only (Delta's
   rule for ``OPTIMIZE ... WHERE``), since whole files are rewritten and a file is
   wholly inside or outside a partition predicate. Nothing is written before both pass.
2. **Plan** (:func:`plan_bins`): per partition, the files smaller than the target are
   packed first-fit decreasing into bins of at most the target's size; a bin of one
   file would only copy it, so it is left out.
3. **Rewrite** (:func:`_write_bins`): one Spark job with a task per bin; each task
   reads its bin's files with pyarrow and writes them as one Parquet file (the data
   source's reader and writer: files of older schemas read with the table's current
   one, missing columns as NULL), and reports it. Each bin's new file must hold as
   many rows as the files it replaces, or nothing is committed.
4. **Commit** as operation ``OPTIMIZE`` with a read set naming the files rewritten
   (``engine.read_set``): it conflicts only with a commit that removed one of them
   (:class:`ConcurrentModificationError`, nothing committed, its new files removed),
   never with appends, which stay live beside its files.

A compaction changes no data: time travel to any version reads the same rows,
streaming reads skip its versions (``datasource.stream_read``) and the change feed
has nothing for them. Nothing to compact commits nothing.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.model import OPTIMIZE, DmlResult, FileEntry, TableMeta
from spark_integration.engine.read_set import Condition, ReadSet
from spark_integration.spark import filesystem
from spark_integration.spark.datasource.batch_read import files_to_read
from spark_integration.spark.dml import check_predicate, conditions_of, session_of
from spark_integration.spark.hook import Job, new_job
from txn.errors import TransactionAbortedError

if TYPE_CHECKING:
    from spark_integration.engine.catalog import Catalog
    from spark_integration.service.client import RemoteCatalog

log = logging.getLogger(__name__)

MB = 1 << 20
#: At most this many rewrite tasks (Spark runs as many at once as it has cores).
MAX_TASKS = 1024
#: The column a rewrite task reports its files in: each a pickled ``(bin, FileEntry)``.
_REPORT = "entry"


def optimize(
    catalog: Catalog | RemoteCatalog,
    name: str,
    predicate: str | None,
    target_file_mb: object,
    spark: SparkSession | None,
) -> DmlResult:
    """Compact the table's small files; see the module docstring.

    Returns the committed version with ``files_added``/``files_removed`` (row counts
    are 0: no row changes). With nothing to compact (at most one small file in each
    partition, or every file at least ``target_file_mb``) nothing is committed and
    the result is the current version with 0 files.
    """
    target = target_bytes(target_file_mb)
    session = session_of(spark)
    prepared = catalog.prepare(name)
    meta, version = prepared.meta, prepared.head.version
    schema = StructType.fromJson(json.loads(meta.schema_json))
    what = f"optimize of table {name!r}"
    predicate = check_predicate(session, schema, predicate, what)
    conditions = partition_conditions(predicate, schema, meta.partition_by, what)
    _, _, entries = catalog.files(name, version, FileEntry)
    probe = ReadSet(version, (), conditions)
    bins = plan_bins([e for e in entries if probe.may_match(e)], target)
    removes = tuple(e.path for b in bins for e in b)
    log.info(
        "%s: %d of %d files go into %d files (target %d bytes, version %d)",
        what,
        len(removes),
        len(entries),
        len(bins),
        target,
        version,
    )
    if not bins:
        return DmlResult(version)
    job = new_job(meta.location)
    try:
        written = _write_bins(session, schema, meta, bins, job)
        catalog.failpoints.hit(fp.BEFORE_COMMIT, job.job_id)
    except Exception:
        filesystem.delete_tree(job.staging)  # no commit was attempted: nothing names them
        raise
    try:
        committed = catalog.commit_files(
            name,
            OPTIMIZE,
            written,
            job_id=job.job_id,
            job_started_ms=job.started_ms,
            read_set=ReadSet(version, removes),
            schema_version=prepared.head.schema_version,
        )
    except TransactionAbortedError:
        # Definitely not committed (a commit removed a file it rewrote, a vacuum's fence).
        filesystem.delete_tree(job.staging)
        raise
    # Any other failure leaves the files: the commit may have landed (as for DML).
    log.info("%s committed version %d (job %s)", what, committed.version, job.job_id)
    return DmlResult(committed.version, files_added=len(written), files_removed=len(removes))


# --- step 1: check ---------------------------------------------------------------------


def target_bytes(target_file_mb: object) -> int:
    """``target_file_mb`` in bytes; a clear error for anything but a positive number."""
    if isinstance(target_file_mb, bool) or not isinstance(target_file_mb, int | float):
        raise TypeError(
            f"optimize: target_file_mb must be a number, got {type(target_file_mb).__name__}"
        )
    if not math.isfinite(target_file_mb) or target_file_mb <= 0:
        raise ValueError(f"optimize: target_file_mb must be positive, got {target_file_mb}")
    return max(1, int(target_file_mb * MB))


def partition_conditions(
    predicate: str | None, schema: StructType, partition_by: Sequence[str], what: str
) -> tuple[Condition, ...]:
    """The conditions of a predicate over partition columns only (decided exactly per
    file); ``ValueError`` for any other predicate. ``None``: every partition."""
    if predicate is None:
        return ()
    if not partition_by:
        raise ValueError(
            f"{what}: the table has no partition columns, so a predicate cannot select "
            f"files to compact; got {predicate!r} (pass None to compact the whole table)"
        )
    conditions, exact = conditions_of(predicate, schema, partition_by)
    if not exact:
        raise ValueError(
            f"{what}: the predicate {predicate!r} must be an AND of simple comparisons "
            "(=, <, <=, >, >=, IN, IS [NOT] NULL) of partition columns "
            f"{list(partition_by)} with literals: compaction rewrites whole files, so "
            "it selects them by partition only"
        )
    return conditions


# --- step 2: plan ----------------------------------------------------------------------


def plan_bins(entries: Sequence[FileEntry], target: int) -> list[tuple[FileEntry, ...]]:
    """The files to compact, grouped into the bins that each become one file.

    Per partition (files of different partitions never share a bin), files smaller
    than ``target`` bytes, packed first-fit decreasing: each file, largest first,
    goes into the first bin it fits in (total size at most ``target``), else a new
    one. Bins of a single file are left out: rewriting it would change nothing.
    Deterministic: partitions in order of first appearance, ties broken by path.
    """
    by_partition: dict[tuple[tuple[str, str | None], ...], list[FileEntry]] = {}
    for entry in entries:
        if entry.size_bytes < target:
            key = tuple(sorted(entry.partition.items()))
            by_partition.setdefault(key, []).append(entry)
    out: list[tuple[FileEntry, ...]] = []
    for files in by_partition.values():
        bins: list[list[FileEntry]] = []
        loads: list[int] = []
        for entry in sorted(files, key=lambda e: (-e.size_bytes, e.path)):
            for i, load in enumerate(loads):
                if load + entry.size_bytes <= target:
                    bins[i].append(entry)
                    loads[i] += entry.size_bytes
                    break
            else:
                bins.append([entry])
                loads.append(entry.size_bytes)
        out.extend(tuple(b) for b in bins if len(b) > 1)
    return out


# --- step 3: rewrite -------------------------------------------------------------------


def _write_bins(
    spark: SparkSession,
    schema: StructType,
    meta: TableMeta,
    bins: Sequence[tuple[FileEntry, ...]],
    job: Job,
) -> list[FileEntry]:
    """Each bin's rows as one new file in ``job``'s folder, by one Spark job.

    A task per bin (``spark.range`` with as many slices as bins gives each slice one
    bin number, up to ``MAX_TASKS``); each reads and writes with pyarrow, so a bin's
    rows never leave its task and land in exactly one file. Raises ``RuntimeError``
    if a bin's new file does not hold exactly its rows.
    """
    to_read = [files_to_read(meta.location, list(b)) for b in bins]
    schema_json = schema.json()
    columns = tuple(schema.fieldNames())
    partition_by, location, staging = meta.partition_by, meta.location, job.staging

    def rewrite_task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        from spark_integration.spark.datasource.files import read_files, write_batches
        from spark_integration.spark.datasource.write_plan import task_tag

        target = to_arrow_schema(StructType.fromJson(json.loads(schema_json)), timezone="UTC")
        reports: list[bytes] = []
        for batch in batches:
            for index in batch.column("id").to_pylist():
                written = write_batches(
                    read_files(to_read[index], target, partition_by),
                    location=location,
                    staging=staging,
                    columns=columns,
                    partition_by=partition_by,
                    tag=f"{task_tag()}-{index}",
                )
                reports.extend(pickle.dumps((index, entry)) for entry in written)
        yield pa.RecordBatch.from_arrays([pa.array(reports, pa.binary())], names=[_REPORT])

    tasks = min(len(bins), MAX_TASKS)  # past that, a task rewrites several bins in turn
    slices = spark.range(0, len(bins), 1, numPartitions=tasks)
    reported = slices.mapInArrow(rewrite_task, f"{_REPORT} binary").collect()
    by_bin: dict[int, list[FileEntry]] = {}
    for row in reported:
        index, entry = pickle.loads(row[_REPORT])
        by_bin.setdefault(index, []).append(entry)
    written: list[FileEntry] = []
    for index, files in enumerate(bins):
        new = by_bin.get(index, [])
        rows_in = sum(e.record_count for e in files)
        rows_out = sum(e.record_count for e in new)
        if rows_out != rows_in or len(new) != min(rows_in, 1):  # no file for no rows
            raise RuntimeError(
                f"optimize of table {meta.name!r}: {len(files)} files of {rows_in} rows were "
                f"rewritten as {len(new)} files of {rows_out} rows; nothing was committed"
            )
        written.extend(new)
    return written
