"""Time travel by timestamp: ``lh.version_at`` and ``lh.read(..., timestamp=)``.

Through a real gateway (``GetTable`` with ``as_of_ms``) and embedded. A version's time
is its committer's clock as recorded in its log record, never decreasing from one
version to the next; the version as of a time is the latest one committed at or
before it.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from spark_integration import DataFile, Lakehouse, VersionNotFoundError
from spark_integration.engine import Catalog, CommitRequest
from spark_integration.engine.commit import GroupAttempt
from spark_integration.engine.model import APPEND, FileEntry
from spark_integration.spark.hook import new_job
from tests.servers import ServerProcess
from txn import TransactionConfig, TransactionManager
from txn.errors import TransactionAbortedError
from txn.remote import RemoteTransactionManager

pytestmark = pytest.mark.integration

TEST_CONFIG = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)
SCHEMA = StructType([StructField("id", LongType())])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("gateway")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/gw.db"], workdir).start()
    yield server
    server.stop()


@pytest.fixture(params=["remote-sqlite", "sqlite"])
def lh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lakehouse]:
    tm: TransactionManager | RemoteTransactionManager
    if request.param == "remote-sqlite":
        tm = TransactionManager.remote(request.getfixturevalue("gateway").address)
    else:
        tm = TransactionManager.embedded(f"sqlite:///{tmp_path}/store.db", config=TEST_CONFIG)
    yield Lakehouse(
        cast(TransactionManager, tm), tmp_path / "warehouse", catalog=f"c{os.urandom(6).hex()}"
    )
    tm.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def append(lh: Lakehouse, n: int) -> int:
    job = new_job(os.path.join(lh.warehouse, "t"))
    return lh.append_files("t", [DataFile(f"{job.staging}/part-{n}.parquet", 10, n)])


def tick() -> int:
    """A millisecond strictly between the commits before and after it."""
    time.sleep(0.005)
    at = now_ms()
    time.sleep(0.005)
    return at


def test_the_version_as_of_a_time_is_the_latest_committed_by_then(lh: Lakehouse) -> None:
    before_create = tick()
    lh.create_table("t", SCHEMA)
    times = [tick()]
    for n in (1, 2, 3):
        append(lh, n)
        times.append(tick())
    assert [lh.version_at("t", t) for t in times] == [0, 1, 2, 3]
    utc = datetime.datetime.fromtimestamp(times[2] / 1000, tz=datetime.UTC)
    assert lh.version_at("t", utc) == 2
    assert lh.version_at("t", utc.replace(tzinfo=None)) == 2  # naive means UTC
    assert lh.version_at("t", utc.isoformat()) == 2
    assert lh.version_at("t", utc.isoformat().replace("+00:00", "Z")) == 2
    with pytest.raises(VersionNotFoundError, match="created after"):
        lh.version_at("t", before_create)
    with pytest.raises(VersionNotFoundError, match="future"):
        lh.version_at("t", now_ms() + 60_000)


def test_bad_timestamps_are_refused_by_name(lh: Lakehouse) -> None:
    lh.create_table("t", SCHEMA)
    with pytest.raises(ValueError, match="ISO-8601"):
        lh.version_at("t", "yesterday")
    with pytest.raises(TypeError, match="timestamp"):
        lh.version_at("t", True)
    with pytest.raises(ValueError, match="negative"):
        lh.version_at("t", -1)


@pytest.mark.spark
def test_read_as_of_a_timestamp(spark: SparkSession, lh: Lakehouse) -> None:
    lh.create_table("t", SCHEMA)
    df = spark.createDataFrame([(i,) for i in range(5)], SCHEMA)
    lh.append("t", df)
    between = tick()
    lh.append("t", df)
    assert lh.read(spark, "t", timestamp=between).count() == 5
    assert lh.read(spark, "t").count() == 10
    with pytest.raises(ValueError, match="not both"):
        lh.read(spark, "t", version=1, timestamp=between)


# --- issue 30, item 3: an answer, once given, is the answer for ever --------------------


@pytest.fixture
def catalog_name() -> str:
    return f"c{os.urandom(6).hex()}"


def _request(n: int) -> CommitRequest:
    return CommitRequest(APPEND, (FileEntry(f"part-{n}.parquet", 10, n),), f"job-{n}", 0)


def test_an_answer_given_while_a_commit_was_in_flight_stays_the_answer(
    gateway: ServerProcess, tmp_path: Path, catalog_name: str
) -> None:
    """Fails before the fix: ``version_at(T)`` answered 1, then 2 for the same T.

    Interleaving, with a real ``percolake serve``: a commit attempt (a catalog driving
    the gateway's transactions, as a second gateway or ``gateway_catalog=False``
    would) reads the head and takes its log time ``L`` (``GroupAttempt.run``); then
    ``version_at(T)`` for a ``T`` after ``L`` is asked through the gateway's
    ``GetTable``: the log shows versions 0 and 1 only, so it answers 1; then the
    attempt reaches its commit point and version 2 lands with log time ``L <= T``.
    Asked again, ``version_at(T)`` answered 2. Now the first answer raised the
    head's ``last_ms`` above ``T`` in its own transaction, so the attempt conflicts
    on the head, and its retry takes a log time above ``T``.
    """
    tm = TransactionManager.remote(gateway.address)
    try:
        lh = Lakehouse(cast(TransactionManager, tm), tmp_path / "warehouse", catalog=catalog_name)
        lh.create_table("t", SCHEMA)
        append(lh, 1)
        writer = Catalog(tm, catalog_name)
        tx = tm.begin()
        (staged,) = GroupAttempt(writer.tables, "t", tx).run([_request(2)])
        assert not isinstance(staged, BaseException) and staged.version == 2
        at = tick()  # after the attempt's log time
        assert lh.version_at("t", at) == 1
        with pytest.raises(TransactionAbortedError):
            tx.commit()  # before the fix it committed version 2 at a log time <= at
        assert (
            writer.commit_files(
                "t", APPEND, _request(2).files, job_id="again", job_started_ms=0
            ).version
            == 2
        )
        assert lh.version_at("t", at) == 1
        assert [c.timestamp_ms > at for c in lh.history("t")] == [False, False, True]
    finally:
        tm.close()


def test_a_committer_whose_clock_is_behind_cannot_change_an_answer(
    gateway: ServerProcess, tmp_path: Path, catalog_name: str
) -> None:
    """Fails before the fix: ``version_at(T)`` answered 1, then 2 for the same T.

    Interleaving, with a real ``percolake serve``: ``version_at(T)`` through the
    gateway, ``T`` now, answers 1 (the latest). Then a committer whose clock is a
    minute behind (another gateway, or a client-driven catalog; here a catalog with
    a skewed ``clock_ms`` over the gateway's transactions) appends version 2. Its log
    time was ``max(its clock, the head's last_ms)``, the head's being version 1's,
    at or below ``T``: asked again, ``version_at(T)`` answered 2. Now the answer
    raised the head's ``last_ms`` above ``T``, and version 2's log time is above it.
    """
    tm = TransactionManager.remote(gateway.address)
    try:
        lh = Lakehouse(cast(TransactionManager, tm), tmp_path / "warehouse", catalog=catalog_name)
        lh.create_table("t", SCHEMA)
        append(lh, 1)
        at = tick()
        assert lh.version_at("t", at) == 1
        behind = Catalog(tm, catalog_name, clock_ms=lambda: now_ms() - 60_000)
        assert (
            behind.commit_files(
                "t", APPEND, _request(2).files, job_id="behind", job_started_ms=0
            ).version
            == 2
        )
        assert lh.version_at("t", at) == 1
        times = [c.timestamp_ms for c in lh.history("t")]
        assert times == sorted(times) and times[2] > at
    finally:
        tm.close()
