"""Free ports for the servers the tools and tests start (``percolake.tools.ports``).

The CI run of stop 40 lost every test of a Cassandra node: a MinIO started in the
other xdist worker took the node's CQL port between the moment it was chosen (a
kernel bind of port 0) and the moment the JVM bound it, ~15 s later. These tests
hold the two rules that close that window, and the Cassandra retry that covers a
process outside them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from percolake.tools import ports
from percolake.tools.cassandra import (
    CassandraCluster,
    CassandraError,
    CassandraPortTaken,
    start_on_free_ports,
)
from percolake.tools.ports import CLAIM_TTL_S, candidate_ports, claims_dir, free_ports

pytestmark = pytest.mark.unit


class _Scripted:
    """Stands in for the module's random source: the candidates to try, in order."""

    def __init__(self, picks: list[int]) -> None:
        self.picks = iter(picks)

    def randrange(self, start: int, stop: int) -> int:
        pick = next(self.picks)
        assert start <= pick < stop
        return pick


@pytest.fixture
def listener() -> Iterator[int]:
    """A port in the handed-out range with a listener on it, and no claim."""
    (port,) = free_ports(1)
    (claims_dir() / str(port)).unlink()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield port


def test_ports_are_distinct_bindable_and_clear_of_the_ephemeral_range() -> None:
    low, high = (int(f) for f in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    candidates = candidate_ports()
    assert candidates.stop <= low or candidates.start > high
    chosen = free_ports(20)
    assert len(set(chosen)) == 20 and all(p in candidates for p in chosen)
    for port in chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # nothing listens there
        assert (claims_dir() / str(port)).is_file()


def test_a_span_hands_out_consecutive_free_ports() -> None:
    firsts = free_ports(2, span=3)
    every = {p + i for p in firsts for i in range(3)}
    assert len(every) == 6
    assert all((claims_dir() / str(p)).is_file() for p in every)


def test_a_listened_or_claimed_port_is_passed_over(
    listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    (claimed,) = free_ports(1)  # claimed, nothing listens
    (free,) = free_ports(1)
    (claims_dir() / str(free)).unlink()  # free again to every caller
    monkeypatch.setattr(ports, "_rng", _Scripted([listener, claimed, free]))
    assert free_ports(1) == [free]


def test_a_claim_older_than_its_ttl_no_longer_holds_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    (port,) = free_ports(1)
    stale = time.time() - CLAIM_TTL_S - 1
    os.utime(claims_dir() / str(port), (stale, stale))
    monkeypatch.setattr(ports, "_rng", _Scripted([port]))
    assert free_ports(1) == [port]


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="count and span must be at least 1"):
        free_ports(0)
    with pytest.raises(ValueError, match="count and span must be at least 1"):
        free_ports(1, span=0)


_CHOOSER = """
import json, sys
from percolake.tools.ports import free_ports
print(json.dumps([free_ports(1)[0] for _ in range(int(sys.argv[1]))]))
"""


def test_processes_choosing_at_once_never_share_a_port() -> None:
    """The race of stop 40, between processes: each port goes to one of them."""
    choosers = [
        subprocess.Popen([sys.executable, "-c", _CHOOSER, "40"], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    chosen = [json.loads(c.communicate(timeout=60)[0]) for c in choosers]
    assert all(c.returncode == 0 for c in choosers)
    every = [p for ports_of_one in chosen for p in ports_of_one]
    assert len(every) == 160 and len(set(every)) == 160


# --- the Cassandra launcher: a port taken after the check ----------------------------------


def _exited_node(tmp_path: Path, log_line: str) -> CassandraCluster:
    cluster = CassandraCluster(1, tmp_path)
    logs = cluster.layout.node_dir(1) / "logs"
    logs.mkdir(parents=True)
    (logs / "stdout.log").write_text(f"Exception encountered during startup: {log_line}\n")
    return cluster


def test_a_node_that_exits_on_a_taken_port_says_so(tmp_path: Path) -> None:
    taken = _exited_node(
        tmp_path / "a",
        "Failed to bind port 42829 on 127.0.0.1.\n"
        "Caused by: io.netty.channel.unix.Errors$NativeIoException: bind(..) failed with "
        "error(-98): Address already in use",
    )
    with pytest.raises(CassandraPortTaken, match="Address already in use"):
        taken._wait_cql(1, time.monotonic() + 5)
    other = _exited_node(tmp_path / "b", "java.lang.OutOfMemoryError: Java heap space")
    with pytest.raises(CassandraError, match="exited during startup") as raised:
        other._wait_cql(1, time.monotonic() + 5)
    assert not isinstance(raised.value, CassandraPortTaken)


def test_start_on_free_ports_starts_again_on_other_ports_after_a_taken_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[tuple[int, int, int, list[str]]] = []

    def start(self: CassandraCluster) -> None:
        layout = self.layout
        layout.base_dir.mkdir(parents=True, exist_ok=True)
        starts.append(
            (
                layout.native_transport_port,
                layout.storage_port,
                layout.jmx_port,
                sorted(p.name for p in layout.base_dir.iterdir()),
            )
        )
        (layout.base_dir / "left-by-the-failed-start").touch()
        if len(starts) == 1:
            raise CassandraPortTaken("node 1 exited during startup: Address already in use")

    monkeypatch.setattr(CassandraCluster, "start", start)
    options: dict[str, Any] = {"cluster_name": "retried", "heap_mb": 256}
    cluster = start_on_free_ports(3, tmp_path / "c", **options)
    (first, second) = starts
    assert len(set(first[:3]) | set(second[:3])) == 6  # every port chosen afresh
    assert second[3] == []  # in a fresh directory
    assert cluster.layout.native_transport_port == second[0]
    assert cluster.layout.cluster_name == "retried" and cluster.layout.heap_mb == 256


def test_start_on_free_ports_gives_up_after_its_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def start(self: CassandraCluster) -> None:
        self.layout.base_dir.mkdir(parents=True, exist_ok=True)
        calls.append(self.layout.native_transport_port)
        raise CassandraPortTaken("Address already in use")

    monkeypatch.setattr(CassandraCluster, "start", start)
    with pytest.raises(CassandraPortTaken):
        start_on_free_ports(1, tmp_path / "d", attempts=2)
    assert len(calls) == 2
