"""A streaming read (``PercolakeStreamReader``) planning over versions that retention
expired, without Spark: the reader's driver-side methods against an embedded catalog.

History leaves expired versions out, so a stream whose next version expired used to
read it as empty and go on. It must fail instead, naming the table, the version, the
retention that expired it and where a restarted query can start; a stream whose
versions are all still there reads as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import LongType, StringType, StructField, StructType

import spark_integration.spark.datasource.stream_read as stream_read
from spark_integration import Retention, VersionNotFoundError, VersionVacuumedError
from spark_integration.engine import Catalog
from spark_integration.engine.model import APPEND, OVERWRITE, FileEntry, TableMeta
from spark_integration.spark.datasource.gateway import CATALOG
from spark_integration.spark.datasource.options import StreamReadOptions
from spark_integration.spark.datasource.stream_read import PercolakeStreamReader, _StreamSplit
from spark_integration.spark.hook import STAGING_PREFIX
from txn import TransactionManager

pytestmark = pytest.mark.unit

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
DAY_MS = 86_400_000
#: An hour of log: a version replaced more than that before the expiry's clock expires.
RETENTION = Retention(log_retention_s=3600, mark_retention_s=3600)


class Table:
    """Table ``t`` in an embedded catalog, one file per append."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.n = 0
        catalog.create(
            TableMeta("t", SCHEMA.json(), ("day",), "/nowhere/t", int(time.time() * 1000)),
            "create-t",
            retention=RETENTION,
        )

    def append(self) -> int:
        self.n += 1
        path = f"{STAGING_PREFIX}j{self.n}/day=d/f{self.n}.parquet"
        return self.catalog.commit_files(
            "t",
            APPEND,
            [FileEntry(path, 10, 1, {"day": "d"})],
            job_id=f"job-{self.n}",
            job_started_ms=int(time.time() * 1000),
        ).version

    def expire_all_but_latest(self) -> int:
        """Expire as of two days from now: every version but the latest."""
        now = int(time.time() * 1000) + 2 * DAY_MS
        return self.catalog.expire("t", now).readable_from


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[Table]:
    tm = TransactionManager.embedded("memory://")
    catalog = Catalog(tm, CATALOG)

    @contextmanager
    def gateway(address: str) -> Iterator[Catalog]:
        yield catalog

    # The reader asks the gateway for heads, history and retention; here the
    # catalog answers itself (the same methods as the remote one).
    monkeypatch.setattr(stream_read, "open_gateway", gateway)
    yield Table(catalog)
    tm.close()


def reader(starting_version: int | None = None) -> PercolakeStreamReader:
    opts = StreamReadOptions("t", "unused:0", starting_version, False, None, False)
    return PercolakeStreamReader(opts, SCHEMA)


def versions_read(
    r: PercolakeStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[int]:
    splits = r.partitions(start, end)
    return sorted(f.version for s in splits if isinstance(s, _StreamSplit) for f in s.files)


def test_a_stream_whose_next_version_expired_fails_naming_it(table: Table) -> None:
    assert [table.append() for _ in range(3)] == [1, 2, 3]
    r = reader(starting_version=1)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert versions_read(r, start, end) == [1, 2, 3]
    r.commit(end)
    assert [table.append() for _ in range(2)] == [4, 5]

    assert table.expire_all_but_latest() == 5

    # Version 4 is next: it expired, so the stream stops there instead of skipping it.
    with pytest.raises(VersionNotFoundError) as caught:
        r.latestOffset(end, r.getDefaultReadLimit())
    message = str(caught.value)
    assert "version 4 of table 't'" in message
    assert "expired under the table's log retention (1 h)" in message
    assert "versions from 5 on are readable" in message
    assert "new checkpoint and startingVersion=5 or later" in message


def test_a_restarted_stream_planning_a_batch_over_an_expired_version_fails(
    table: Table,
) -> None:
    """After a restart Spark plans the batch its offset log recorded, from a fresh reader."""
    assert [table.append() for _ in range(3)] == [1, 2, 3]
    start = {"version": 1, "index": 0, "snapshot": False}
    end = {"version": 3, "index": 1, "snapshot": False}
    assert table.expire_all_but_latest() == 3
    with pytest.raises(VersionNotFoundError, match=r"version 1 of table 't': it expired"):
        reader(starting_version=1).partitions(start, end)


def test_streams_whose_versions_are_all_retained_read_as_before(table: Table) -> None:
    assert [table.append() for _ in range(3)] == [1, 2, 3]
    ahead = reader(starting_version=1)  # has read every version before expiry
    start = ahead.initialOffset()
    end = ahead.latestOffset(start, ahead.getDefaultReadLimit())
    assert versions_read(ahead, start, end) == [1, 2, 3]
    ahead.commit(end)

    assert table.expire_all_but_latest() == 3
    assert table.append() == 4

    after = ahead.latestOffset(end, ahead.getDefaultReadLimit())
    assert after == {"version": 5, "index": 0, "snapshot": False}
    assert versions_read(ahead, end, after) == [4]
    # Started at the oldest readable version: reads it and what came after.
    fresh = reader(starting_version=3)
    start = fresh.initialOffset()
    end = fresh.latestOffset(start, fresh.getDefaultReadLimit())
    assert versions_read(fresh, start, end) == [3, 4]
    # Without startingVersion: the latest snapshot, unaffected by expiry.
    snap = reader()
    start = snap.initialOffset()
    assert start == {"version": 4, "index": 0, "snapshot": True}
    end = snap.latestOffset(start, snap.getDefaultReadLimit())
    assert len(snap.partitions(start, end)) >= 1


def test_a_stream_restarted_on_a_snapshot_of_an_expired_version_says_it_expired(
    table: Table,
) -> None:
    """A query without startingVersion checkpoints the latest version's snapshot as its
    offset; restarted after that version expired, it must name retention, not vacuum
    (the version's files are all still there)."""
    assert [table.append() for _ in range(2)] == [1, 2]
    first = reader()
    start = first.initialOffset()
    assert start == {"version": 2, "index": 0, "snapshot": True}
    assert [table.append() for _ in range(2)] == [3, 4]
    assert table.expire_all_but_latest() == 4

    def latest(r: PercolakeStreamReader) -> object:
        return r.latestOffset(start, r.getDefaultReadLimit())

    def partitions(r: PercolakeStreamReader) -> object:
        return r.partitions(start, {"version": 5, "index": 0, "snapshot": False})

    for plan in (latest, partitions):
        with pytest.raises(VersionNotFoundError) as caught:
            plan(reader())  # a fresh reader, as after a restart
        message = str(caught.value)
        assert "version 2 of table 't'" in message
        assert "expired under the table's log retention (1 h)" in message
        assert "versions from 4 on are readable" in message
        assert "new checkpoint and startingVersion=4 or later" in message
        assert "vacuum" not in message


def test_a_stream_restarted_on_a_snapshot_vacuum_fenced_off_still_says_vacuum(
    table: Table,
) -> None:
    """Below the oldest readable version through vacuum's fence, not retention: the
    version is still in history, an overwrite replaced its files and vacuum may have
    removed them."""
    assert [table.append() for _ in range(2)] == [1, 2]
    start = reader().initialOffset()
    assert start == {"version": 2, "index": 0, "snapshot": True}
    replaced = table.catalog.commit_files(
        "t",
        OVERWRITE,
        [FileEntry(f"{STAGING_PREFIX}w/day=d/f.parquet", 10, 1, {"day": "d"})],
        job_id="job-overwrite",
        job_started_ms=int(time.time() * 1000),
        base_version=2,
    )
    assert replaced.version == 3
    cutoff_ms = int(time.time() * 1000) + 1
    time.sleep(0.01)
    plan = table.catalog.vacuum_plan("t", cutoff_ms)
    table.catalog.vacuum_fence("t", plan, cutoff_ms)
    assert table.catalog.prepare("t").head.min_readable_version == 3
    assert [e.record.version for e in table.catalog.history("t")] == [0, 1, 2, 3]

    with pytest.raises(VersionVacuumedError, match="vacuum removed its files"):
        reader().latestOffset(start, reader().getDefaultReadLimit())
