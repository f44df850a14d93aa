"""``percolake_is_leader`` across three real ``percolake serve`` replicas (issue 31 item
2): it sums to 1 while the store is reachable, through a kill and a pause of the
leader, never to 2, and to 0 while the store cannot be written; every replica exports
it with the epoch it last saw and the leader row's age."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from percolake.tools.ports import free_ports
from tests.servers import ServerProcess, sqlite_write_locked

pytestmark = pytest.mark.integration

#: Bound of every wait below (never a timing assertion).
_WAIT_S = 30.0
#: A scrape of a paused process times out after this long: it counts as no answer.
_SCRAPE_TIMEOUT_S = 0.5


class Replica:
    def __init__(self, url: str, workdir: Path) -> None:
        self.metrics_port = free_ports(1)[0]
        self.server = ServerProcess(
            "all",
            [
                "--store",
                url,
                "--leader-lease-ms",
                "1000",
                "--metrics-listen",
                f"127.0.0.1:{self.metrics_port}",
            ],
            workdir,
        )

    def leadership(self) -> dict[str, float] | None:
        """This replica's leadership series for role ``tso`` (None: no answer)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=_SCRAPE_TIMEOUT_S) as response:
                text = response.read().decode()
        except (OSError, urllib.error.URLError):
            return None
        return {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("percolake_") and s.labels.get("role") == "tso"
        }


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    # A write waits 100 ms for SQLite's lock: the outage below shows within a round.
    url = f"sqlite:///{tmp_path / 'store.db'}?busy_timeout_ms=100"
    started: list[Replica] = []
    try:
        for _ in range(3):
            replica = Replica(url, tmp_path)
            replica.server.start()
            started.append(replica)
        yield started
    finally:
        for replica in started:
            replica.server.signal(signal.SIGCONT)
            replica.server.kill()


def _is_leader(replicas: list[Replica]) -> list[float | None]:
    """Each replica's ``percolake_is_leader{role="tso"}``, checked to sum to at most 1."""
    values: list[float | None] = []
    for replica in replicas:
        series = replica.leadership()
        values.append(None if series is None else series["percolake_is_leader"])
    assert sum(v or 0 for v in values) <= 1, f"two replicas say they lead: {values}"
    return values


def _wait(
    replicas: list[Replica], done: str, until: Callable[[list[float | None]], bool]
) -> list[float | None]:
    deadline = time.monotonic() + _WAIT_S
    while True:
        values = _is_leader(replicas)
        if until(values):
            return values
        if time.monotonic() > deadline:
            raise AssertionError(f"never {done}: percolake_is_leader {values}")
        time.sleep(0.05)


def _one_leader(values: list[float | None]) -> bool:
    return sum(v or 0 for v in values) == 1


def test_is_leader_sums_to_one_through_kill_and_pause_and_to_zero_in_a_store_outage(
    replicas: list[Replica], tmp_path: Path
) -> None:
    """Fails on the code before this fix: during the store outage the leader kept
    exporting ``percolake_is_leader 1`` (it changed only on an explicit step-down, and
    a lease that runs out for want of renewals takes none), and followers exported no
    ``percolake_is_leader`` or ``percolake_leader_epoch`` at all.
    """
    values = _wait(replicas, "one leader", _one_leader)
    epochs = set()
    for replica in replicas:  # followers export the series too, with the same epoch
        series = replica.leadership()
        assert series is not None
        assert {"percolake_is_leader", "percolake_leader_epoch"} <= series.keys(), series
        assert series["percolake_leader_row_age_seconds"] >= 0
        epochs.add(series["percolake_leader_epoch"])
    assert len(epochs) == 1 and epochs.pop() >= 1

    # The store takes no writes: no lease can be renewed, so no replica leads.
    with sqlite_write_locked(tmp_path / "store.db"):
        _wait(replicas, "no leader in the outage", lambda v: v == [0, 0, 0])
    _wait(replicas, "one leader after the outage", _one_leader)

    # kill -9 of the leader: another takes over, the dead one answers nothing.
    values = _is_leader(replicas)
    killed = values.index(1)
    replicas[killed].server.kill()
    survivors = [r for i, r in enumerate(replicas) if i != killed]
    values = _wait(survivors, "a new leader after the kill", _one_leader)

    # SIGSTOP of the new leader: it answers nothing while paused; when it wakes, its
    # lapsed lease reads 0 at once if another took over meanwhile, never 1 beside it.
    paused = survivors[values.index(1)]
    paused.server.signal(signal.SIGSTOP)
    try:
        time.sleep(1.5)  # past the paused leader's lease (1 s): a takeover may come
        _is_leader(survivors)
    finally:
        paused.server.signal(signal.SIGCONT)
    values = _wait(
        survivors, "one leader after the pause", lambda v: None not in v and _one_leader(v)
    )
    seen = {r.leadership()["percolake_leader_epoch"] for r in survivors}  # type: ignore[index]
    assert len(seen) == 1, f"replicas saw different epochs after the pause: {seen}"
