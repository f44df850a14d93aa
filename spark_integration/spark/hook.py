"""The commit hook's file side: a fresh job folder per job, and the files written into it.

A job's Parquet files go into ``<location>/_lh_job=<job id>/`` (Hive-style partition
folders below it). Nothing there is visible until the commit transaction names the
files; a job that dies before that leaves only unreferenced files, which ``vacuum``
removes once the start time in the folder's name is older than its retention.

**Nothing is renamed.** Spark's own writer (``df.write.parquet``) goes through
Hadoop's FileOutputCommitter, which writes each task's files under ``_temporary``
and renames them into place when the task and then the job commit. S3 has no
rename: s3a copies each object and deletes the original, neither atomic nor cheap,
and a job that dies halfway leaves files half moved. So the tasks write the final
files themselves, with pyarrow through ``spark.filesystem``, with the data source's
own task writer (``datasource.files.write_batches``) run by ``mapInArrow``; each
task reports the files it wrote (path, size, rows, partition values and column
statistics, from the footer it just wrote), and the driver collects those reports.
Only the reports of successful task attempts reach the driver: a failed or
speculative attempt's files are never named, and vacuum removes them.

Local tables take the same path. One path means one set of behaviours to test
(file names, partition folder encoding, statistics, what a failed task leaves), and
it is the one the data source already runs on local folders; local tables also
gain column statistics for pruning, and lose nothing (no ``_SUCCESS`` or ``.crc``
side files, which vacuum only ever had to clean up). Files still stay where they
were written: committing never moves data, so it costs the same on any store.
"""

from __future__ import annotations

import calendar
import logging
import pickle
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from spark_integration.engine.locations import join, relative_to
from spark_integration.engine.model import FileEntry
from spark_integration.spark import filesystem
from spark_integration.spark.schema import JOB_COLUMN, quote

log = logging.getLogger(__name__)

STAGING_PREFIX = f"{JOB_COLUMN}="

#: How Spark (Hive) spells a null partition value in a folder name.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

#: Footer reads are small random reads: overlap them.
FOOTER_READERS = 8


@dataclass(frozen=True, slots=True)
class Job:
    """One write job: its id, when it started (driver clock), and its staging folder
    (spelled as locations are: an absolute local path or ``s3://bucket/key``).

    The start time is part of the id, so vacuum reads it back from the folder name
    and compares the very number that the commit compares with vacuum's cutoff:
    no clock skew between machines can make the two disagree.
    """

    job_id: str
    started_ms: int
    staging: str

    @property
    def location(self) -> str:
        """The table location the job folder lies in."""
        return self.staging.rsplit("/", 1)[0]


_JOB_ID = re.compile(r"(\d{8}T\d{6})\.(\d{3})Z-[0-9a-f]+")


def new_job(location: str) -> Job:
    started_ms = time.time_ns() // 1_000_000
    seconds, millis = divmod(started_ms, 1000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
    job_id = f"{stamp}.{millis:03d}Z-{uuid.uuid4().hex[:16]}"
    return Job(job_id, started_ms, join(location, f"{STAGING_PREFIX}{job_id}"))


def job_started_ms(folder_name: str) -> int | None:
    """The start time encoded in a job folder's name; ``None`` for foreign names."""
    if not folder_name.startswith(STAGING_PREFIX):
        return None
    match = _JOB_ID.fullmatch(folder_name[len(STAGING_PREFIX) :])
    if match is None:
        return None
    stamp, millis = match.groups()
    seconds = calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%S"))
    return seconds * 1000 + int(millis)


#: The column a write task reports its files in: each a pickled ``FileEntry``.
_REPORT = "entry"


def write_files(
    df: DataFrame,
    schema: StructType,
    partition_by: tuple[str, ...],
    job: Job,
    *,
    tag: str = "",
) -> list[FileEntry]:
    """The DataFrame's rows, columns in table order, written by its tasks as Parquet
    files into the job folder; returns the files written (paths relative to the
    table location), empty ones left out. ``tag`` starts the file names (a DML job
    writes its change files, ``part-cdc-*``, beside its data files).

    One Spark job (``mapInArrow``, then ``collect`` of the tasks' reports): each task
    writes its own rows straight to their final paths, no rename anywhere.
    """
    # Names, not ``F.col``: classic Columns would not fit a Spark Connect DataFrame.
    ordered = df.select(*[quote(name) for name in schema.fieldNames()])
    columns = tuple(schema.fieldNames())
    location, staging = job.location, job.staging

    def write_task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        # Imported in the task, where it runs: the data source imports this module.
        from spark_integration.spark.datasource.files import write_batches
        from spark_integration.spark.datasource.write_plan import task_tag

        written = write_batches(
            batches,
            location=location,
            staging=staging,
            columns=columns,
            partition_by=partition_by,
            tag=tag + task_tag(),
        )
        reports = [pickle.dumps(entry) for entry in written]
        yield pa.RecordBatch.from_arrays([pa.array(reports, pa.binary())], names=[_REPORT])

    reported = ordered.mapInArrow(write_task, f"{_REPORT} binary").collect()
    files: list[FileEntry] = [pickle.loads(row[_REPORT]) for row in reported]
    log.debug("job %s wrote %d files", job.job_id, len(files))
    return files


def is_data_file(name: str) -> bool:
    """Parquet data files; not ``_SUCCESS``, ``.crc`` checksums or other side files."""
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def _is_hidden_dir(name: str) -> bool:
    # Spark's own rule: "_temporary" and dot folders hide, "_col=value" folders do not.
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def parse_partition(relative_dir: str, partition_by: tuple[str, ...]) -> dict[str, str | None]:
    """Partition values from Hive-style folders ``col=value/...`` as Spark escaped them."""
    values: dict[str, str | None] = {}
    parts = [p for p in relative_dir.split("/") if p]
    if len(parts) != len(partition_by):
        raise ValueError(f"unexpected folder {relative_dir!r} for partitions {partition_by}")
    for part, column in zip(parts, partition_by, strict=True):
        key, sep, raw = part.partition("=")
        if not sep or unquote(key) != column:
            raise ValueError(f"unexpected folder {part!r}: expected partition column {column!r}")
        values[column] = None if raw == HIVE_NULL else unquote(raw)
    return values


def collect_files(location: str, job: Job, partition_by: tuple[str, ...]) -> list[FileEntry]:
    """Every data file in the job folder, with its size and row count from its footer.

    For writers that do not report their files (tests drive the commit hook with
    pyarrow writers of their own). Files with no rows are left out; they stay
    unreferenced and vacuum removes them.
    """
    found: list[tuple[str, int, str, str]] = []  # (path, size, relative, partition dir)
    for stored in filesystem.list_files(job.staging):
        inside = relative_to(job.staging, stored.path)
        if inside is None:
            continue
        *folders, name = inside.split("/")
        if is_data_file(name) and not any(_is_hidden_dir(d) for d in folders):
            relative = relative_to(location, stored.path)
            if relative is not None:
                found.append((stored.path, stored.size, relative, "/".join(folders)))

    def describe(item: tuple[str, int, str, str]) -> FileEntry:
        path, size, relative, partition_dir = item
        return FileEntry(
            path=relative,
            size_bytes=size,
            record_count=filesystem.parquet_metadata(path).num_rows,
            partition=parse_partition(partition_dir, partition_by),
        )

    if len(found) <= 1:
        entries = [describe(item) for item in found]
    else:
        with ThreadPoolExecutor(min(FOOTER_READERS, len(found))) as pool:
            entries = list(pool.map(describe, found))
    kept = [e for e in entries if e.record_count > 0]
    log.debug(
        "job %s wrote %d files (%d empty)", job.job_id, len(entries), len(entries) - len(kept)
    )
    return kept
