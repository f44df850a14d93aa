"""Lakehouse retention (issue 17, item 4) through a real ``percolake serve`` gateway.

Commit times are the gateway's clock, so retentions here are seconds and the test
waits them out. A remote ``Lakehouse`` expires over the gateway's transactions;
the gateway expires by itself after every checkpoint. After expiry the retained
versions read exactly as before, an expired one raises ``VersionNotFoundError``
saying it expired, a replay of an expired batch id commits again while a retained
one does not, the mark and log rows are gone, and after a garbage-collection pass
with retention 0 their versions are gone from the store as well.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import LongType, StringType, StructField, StructType

import spark_integration.engine.expiry as expiry_module
from spark_integration import DataFile, Lakehouse, Retention, VersionNotFoundError
from spark_integration.engine import Catalog, CommitRequest
from spark_integration.engine.model import APPEND, FileEntry, Layout, TableMeta
from spark_integration.spark.hook import STAGING_PREFIX
from storage_adapters import Cell, open_store
from tests.servers import ServerProcess
from tso.timestamp_service import RemoteTimestampSource
from txn import GarbageCollector, TransactionConfig, TransactionManager
from txn.remote import RemoteTransactionManager
from txn.tables import GC_TABLE, STATE_KEY, GcState

pytestmark = pytest.mark.integration

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
CATALOG = "lakehouse"
DAY_MS = 86_400_000
WAIT_S = 40.0


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A ``percolake serve`` on SQLite; ``(address, store url)``."""
    url = f"sqlite:///{tmp_path}/retention.db"
    store = open_store(url)
    # A short grace before anyone leases the state row: collection passes wait 200 ms.
    store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=200).encode())
    store.close()
    server = ServerProcess("all", ["--store", url], tmp_path).start()
    try:
        yield server.address, url
    finally:
        server.stop()


@pytest.fixture
def remote(gateway: tuple[str, str]) -> Iterator[RemoteTransactionManager]:
    tm = TransactionManager.remote(gateway[0], timeout_s=30)
    assert isinstance(tm, RemoteTransactionManager)
    yield tm
    tm.close()


def wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


class Writer:
    """Metadata-only appends to one table, each with its batch id."""

    def __init__(self, lh: Lakehouse, table: str) -> None:
        self.lh, self.table, self.n = lh, table, 0

    def append(self, batch: int) -> int:
        self.n += 1
        path = f"{self.lh.warehouse}/{self.table}/{STAGING_PREFIX}j{self.n}/day=d/f.parquet"
        files = [DataFile(path, 10, 1, {"day": "d"})]
        return self.lh.append_files(self.table, files, app_id="app", batch_id=batch)


def rows(tm: RemoteTransactionManager, kind: str, table: str) -> list[Cell]:
    with tm.begin() as tx:
        return [
            Cell(row, column)
            for row, column, _ in tx.scan(
                f"{CATALOG}.{kind}", Layout.prefix(table), Layout.prefix_end(table)
            )
        ]


def version_of(cell: Cell) -> int:
    return Layout.version_of_log_row("events", cell.row)


def batch_marks(tm: RemoteTransactionManager, table: str) -> dict[int, int]:
    """batch id -> the version its mark names."""
    out: dict[int, int] = {}
    with tm.begin() as tx:
        for row, _, value in tx.scan(
            f"{CATALOG}.marks", Layout.prefix(table), Layout.prefix_end(table)
        ):
            if b'"a"' in row:
                batch = int(row.rsplit(b'"b":', 1)[1].rstrip(b"}"))
                out[batch] = int(value)
    return out


def test_expiry_through_the_gateway(
    gateway: tuple[str, str], remote: RemoteTransactionManager, tmp_path: Path
) -> None:
    _, url = gateway
    lh = Lakehouse(remote, tmp_path / "warehouse")
    lh.create_table("events", SCHEMA, "day", retention=Retention(3, 3))
    assert lh.retention("events") == Retention(3, 3)
    writer = Writer(lh, "events")
    assert [writer.append(b) for b in range(1, 6)] == [1, 2, 3, 4, 5]
    time.sleep(3.5)
    assert [writer.append(b) for b in (6, 7)] == [6, 7]
    before = {v: lh.files("events", v) for v in range(8)}
    history = {c.version: c for c in lh.history("events")}
    old_marks = rows(remote, "marks", "events")

    result = lh.expire("events")

    # Version 5 was the latest until version 6, less than 3 s ago: 5-7 stay.
    assert result.readable_from == 5
    assert result.batch_marks == 5
    for version in (5, 6, 7):
        assert lh.files("events", version) == before[version]
    for version in (0, 4):
        with pytest.raises(VersionNotFoundError, match=f"version {version} .* expired"):
            lh.files("events", version)
    assert [c for c in lh.history("events")] == [history[v] for v in (5, 6, 7)]
    assert sorted(batch_marks(remote, "events")) == [6, 7]
    # A replay of an expired batch commits again; of a retained one, does not.
    assert writer.append(2) == 8
    assert writer.append(6) == 6
    assert writer.append(2) == 8
    assert batch_marks(remote, "events") == {2: 8, 6: 6, 7: 7}

    # Job marks are kept a day, and the log records that index them: a day later
    # (a catalog over the same gateway, with its clock moved) they go too.
    old_marks += rows(remote, "marks", "events")
    old_log = [c for c in rows(remote, "log", "events") if version_of(c) < 8]
    # (The gateway's catalog looks commit timestamps up instead of recording them.)
    assert len(old_log) == 8
    later = Catalog(remote, CATALOG).expire("events", int(time.time() * 1000) + 2 * DAY_MS)
    assert later.readable_from == 8
    assert later.log_cells == len(old_log)
    assert rows(remote, "marks", "events") == []
    assert {version_of(c) for c in rows(remote, "log", "events")} == {8}
    assert lh.files("events", 8) == lh.files("events")

    # The deletes were ordinary transactional deletes: a collection pass with
    # retention 0 removes their versions from the store.
    store = open_store(url)
    try:
        collector = GarbageCollector(
            store,
            timestamps=RemoteTimestampSource(remote.connection),
            retention_s=0,
            grace_ms=200,
        )

        def collected() -> bool:
            collector.run_once()
            left = store.get_versions(f"{CATALOG}.marks", old_marks)
            left.update(store.get_versions(f"{CATALOG}.log", old_log))
            return not any(left.values())

        wait_for("a collection pass to remove the expired rows", collected)
    finally:
        store.close()
    assert lh.files("events") == lh.files("events", 8)
    assert [c.version for c in lh.history("events")] == [8]


def test_the_gateway_expires_after_checkpoints_by_itself(
    remote: RemoteTransactionManager, tmp_path: Path
) -> None:
    """Version 100 is a checkpoint; the gateway's follow-up thread then expires."""
    lh = Lakehouse(remote, tmp_path / "warehouse")
    lh.create_table("stream", SCHEMA, "day", retention=Retention(1, 1))
    writer = Writer(lh, "stream")
    for batch in range(1, 100):
        writer.append(batch)
    time.sleep(1.5)
    listed = lh.files("stream", 99)
    assert writer.append(100) == 100

    def expired() -> bool:
        try:
            lh.files("stream", 98)
        except VersionNotFoundError as exc:
            assert "expired" in str(exc)
            return True
        return False

    wait_for("the gateway's expiry after the checkpoint at version 100", expired)
    assert lh.files("stream", 99) == listed
    wait_for(
        "the batch marks of versions 1-99 to go",
        lambda: sorted(batch_marks(remote, "stream")) == [100],
    )
    assert writer.append(50) == 101  # expired: committed again
    assert writer.append(100) == 100  # retained: a replay


def test_a_publish_on_cassandra_takes_its_turn_with_its_catalogs_group_commits(
    cassandra_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a Cassandra store (issue 27), a group commit of the publish's own catalog (as
    the gateway's drain thread makes them) that arrives while the publish is between
    its reads and its commit waits for it: the publish commits at its first attempt,
    the group lands after it, and the bound is the one the retention gives. Without
    the publish's turn each such group lands first and the publish retries (4 attempts
    here)."""
    t0 = 1_700_000_000_000
    clock = [t0]
    tm = TransactionManager.embedded(
        cassandra_store_url, config=TransactionConfig(gc_publish_interval_ms=10**9)
    )
    try:
        catalog = Catalog(tm, CATALOG, clock_ms=lambda: clock[0])
        catalog.create(
            TableMeta("t", "{}", ("day",), "/nowhere/t", t0),
            "create-t",
            retention=Retention(log_retention_s=10, mark_retention_s=10),
        )
        made = [0]

        def request() -> CommitRequest:
            made[0] += 1
            n = made[0]
            path = f"{STAGING_PREFIX}j{n}/day=d/f{n}.parquet"
            return CommitRequest(APPEND, (FileEntry(path, n, n, {"day": "d"}),), f"job-{n}", t0)

        # A version a second; no checkpoint yet, so no expiry by itself. 20 (was 40 with
        # a 20 s retention): half the commits on the node, the same ten expire.
        for _ in range(20):
            clock[0] += 1000
            (done,) = catalog.commit_group("t", [request()])
            assert not isinstance(done, BaseException)
        now = clock[0] + 1000
        times = {h.record.version: h.record.timestamp_ms for h in catalog.history("t")}
        latest = max(times)
        expected = min(v for v in times if v == latest or times[v + 1] >= now - 10_000)
        assert expected > 0

        real = expiry_module.publish_expiry
        attempts = [0]
        groups: list[threading.Thread] = []
        errors: list[BaseException] = []

        def group() -> None:
            try:
                (result,) = catalog.commit_group("t", [request()])
                if isinstance(result, BaseException):
                    raise result
            except BaseException as exc:
                errors.append(exc)

        def publish_as_groups_arrive(*args: Any) -> Any:
            attempts[0] += 1
            state = real(*args)
            if attempts[0] <= 3:
                groups.append(threading.Thread(target=group))
                groups[-1].start()
                # Ample for a group commit on one node; it lands meanwhile unless it
                # waits for the publish's turn.
                groups[-1].join(timeout=3.0)
            return state

        monkeypatch.setattr(expiry_module, "publish_expiry", publish_as_groups_arrive)
        expired = catalog.expire("t", now)
        for thread in groups:
            thread.join(timeout=60)
        assert errors == []
        assert attempts[0] == 1, attempts
        head = catalog.prepare("t").head
        assert head.version == latest + 1  # the group that waited landed after
        assert expired.readable_from == expected
        assert head.min_readable_version == expected
        with pytest.raises(VersionNotFoundError, match="expired"):
            catalog.files("t", expected - 1, FileEntry)
        assert len(catalog.files("t", expected, FileEntry)[2]) == expected
    finally:
        tm.close()
