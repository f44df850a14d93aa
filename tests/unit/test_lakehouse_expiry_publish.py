"""Expiry's publish under commits (issue 27): a retry does not search the log again.

The publish raises the head's ``min_readable_version``, so every commit of the table
in between makes it retry. Each attempt used to repeat the binary search over log
records, about log2(versions) sequential reads; on one Cassandra node under load the
gateway's follow-up thread then lost the head to commits for over a minute, and the
table's file rows went unexpired meanwhile. ``PublishMemo`` keeps what the attempts
read; these tests hold a retry to a few reads and its bounds to the right ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import spark_integration.engine.catalog as catalog_module
import spark_integration.engine.expiry as expiry_module
import spark_integration.engine.retention as retention_module
from spark_integration.engine import Catalog
from spark_integration.engine.model import APPEND, FileEntry, Layout, TableMeta
from spark_integration.engine.retention import Retention, _first
from txn import Transaction, TransactionConfig, TransactionManager

pytestmark = pytest.mark.unit

T0_MS = 1_700_000_000_000
META = TableMeta("t", "{}", ("day",), "/nowhere/t", T0_MS)
LOG_RETENTION_S = 60
VERSIONS = 250


class Clock:
    def __init__(self) -> None:
        self.ms = T0_MS

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(params=["memory", "sqlite"])
def tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"
    manager = TransactionManager.embedded(url, config=TransactionConfig(resolve_wait_ms=300))
    yield manager
    manager.close()


class LogReads:
    """A transaction that counts its reads of the table's log records."""

    def __init__(self, tx: Transaction, log_table: str, counts: list[int]) -> None:
        self._tx = tx
        self._log = log_table
        self._counts = counts

    def get(self, table: str, row: bytes, column: bytes) -> bytes | None:
        if table == self._log:
            self._counts[-1] += 1
        return self._tx.get(table, row, column)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


def _append(catalog: Catalog, clock: Clock, n: int) -> int:
    path = f"/nowhere/t/day=d/f{n}.parquet"
    return catalog.commit_files(
        "t",
        APPEND,
        [FileEntry(path, 1, 1, {"day": "d"})],
        job_id=f"job-{n}",
        job_started_ms=clock(),
    ).version


def test_a_publish_that_loses_the_head_to_commits_retries_without_searching_the_log(
    tm: TransactionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(catalog_module, "now_ms", clock)
    catalog = Catalog(tm, "lakehouse", clock_ms=clock)
    catalog.create(META, "create-t", retention=Retention(LOG_RETENTION_S, LOG_RETENTION_S))
    committed_ms = {0: clock()}
    for n in range(1, VERSIONS + 1):
        clock.ms += 1000  # one version a second: 60 of them stay readable
        committed_ms[_append(catalog, clock, n)] = clock()
    clock.ms += 1000
    now = clock()
    cutoff = now - LOG_RETENTION_S * 1000
    latest = max(committed_ms)
    expected = min(v for v in committed_ms if v == latest or committed_ms[v + 1] >= cutoff)
    assert expected > catalog.prepare("t").head.min_readable_version  # versions expire now

    real = retention_module.publish_expiry
    log_reads: list[int] = []  # per attempt
    raced = [0]

    def publish_losing_to_commits(tx: Transaction, layout: Layout, *args: Any) -> Any:
        log_reads.append(0)
        state = real(LogReads(tx, layout.log, log_reads), layout, *args)
        if raced[0] < 3:  # a commit of the table lands before this attempt commits
            raced[0] += 1
            _append(catalog, clock, 10_000 + raced[0])
        return state

    monkeypatch.setattr(expiry_module, "publish_expiry", publish_losing_to_commits)
    done = catalog.expire("t", now)

    assert raced[0] == 3
    assert len(log_reads) == 4, log_reads  # three attempts lost the head, one won
    assert log_reads[0] >= 5, log_reads  # the search: about log2(250) reads
    assert all(n <= 3 for n in log_reads[1:]), log_reads  # each retry: the memo's bounds
    assert done.readable_from == expected
    assert catalog.prepare("t").head.min_readable_version == expected


def _at_least(least: int) -> Callable[[int], bool]:
    return lambda v: v >= least


@pytest.mark.parametrize("seed", range(5))
def test_a_guess_is_taken_only_where_it_is_the_least(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        lo = rng.randrange(0, 50)
        hi = lo + rng.randrange(0, 50)
        least = rng.randint(lo, hi)
        holds = _at_least(least)
        guess = rng.choice([None, least, least - 1, least + 1, rng.randint(lo - 3, hi + 3)])
        assert _first(lo, hi, holds, guess) == least, (lo, hi, least, guess)
