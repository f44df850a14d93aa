"""``percolake serve --metrics-listen``: a real server's Prometheus endpoint shows the
figures of the workload it served."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from percolake.serve.config import ServeConfig
from percolake.serve.running import RunningServer
from percolake.tools.ports import free_ports
from tests.servers import ServerProcess
from txn import COMMIT_STEPS, TransactionManager
from txn.errors import TransactionConflictError

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``http://127.0.0.1:PORT/metrics``, by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_endpoint_shows_the_workload_it_served(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    server = ServerProcess(
        "all", ["--store", "memory://", "--metrics-listen", f"127.0.0.1:{port}"], tmp_path
    ).start()
    try:
        before = scrape(port)  # ready: the endpoint serves by the time the ready file exists
        assert before[("percolake_commits_total", ())] == 0
        tm = TransactionManager.remote(server.address)
        commits = 5
        for i in range(commits - 1):
            tx = tm.begin()
            tx.put("t", b"row%d" % i, b"c", b"v")
            tx.commit()
        first, second = tm.begin(), tm.begin()
        first.put("t", b"hot", b"c", b"first")
        second.put("t", b"hot", b"c", b"second")
        first.commit()  # the fifth commit
        with pytest.raises(TransactionConflictError):
            second.commit()
        gone = tm.begin()
        gone.put("t", b"gone", b"c", b"v")
        gone.abort()
        still_open = tm.begin()

        after = scrape(port)
        assert after[("percolake_commits_total", ())] == commits
        assert after[("percolake_aborts_total", (("reason", "conflict"),))] == 1
        assert after[("percolake_aborts_total", (("reason", "user"),))] == 1
        assert after[("percolake_aborts_total", (("reason", "lock_timeout"),))] == 0
        assert after[("percolake_commit_unknown_total", ())] == 0
        # A begin and a commit_ts for each commit, and more for the others.
        assert after[("percolake_timestamps_served_total", ())] >= 2 * commits
        for step in COMMIT_STEPS:
            assert after[("percolake_commit_step_seconds_count", (("step", step),))] == commits
            assert after[("percolake_commit_step_seconds_sum", (("step", step),))] > 0
        assert after[("percolake_commit_seconds_count", ())] == commits
        assert after[("percolake_open_transactions", ())] == 1
        assert after[("percolake_locks_held", ())] == 0
        # A replica alone on its store leads, in the first epoch, and says so.
        assert after[("percolake_is_leader", (("role", "tso"),))] == 1
        assert after[("percolake_leader_epoch", (("role", "tso"),))] == 1
        assert after[("percolake_leader_row_age_seconds", (("role", "tso"),))] >= 0
        still_open.abort()
        assert scrape(port)[("percolake_open_transactions", ())] == 0
        tm.close()
    finally:
        assert server.stop() == 0
    with pytest.raises(OSError):  # stopped with the server
        scrape(port)


def test_port_zero_serves_on_a_free_port_that_stop_frees() -> None:
    running = RunningServer(
        ServeConfig(store_url="memory://", listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    )
    try:
        assert running.metrics_port is not None and running.metrics_port > 0
        assert ("percolake_commits_total", ()) in scrape(running.metrics_port)
    finally:
        running.stop()
    with pytest.raises(OSError):
        scrape(running.metrics_port)


def test_no_endpoint_without_the_flag() -> None:
    running = RunningServer(ServeConfig(store_url="memory://", listen="127.0.0.1:0"))
    try:
        assert running.metrics_port is None
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("9100", "--metrics-listen: invalid address '9100': expected HOST:PORT"),
        ("localhost:http", "--metrics-listen: invalid address 'localhost:http'"),
        ("127.0.0.1:70000", "expected HOST:PORT with a port number"),
        ("127.0.0.1:7171", "--metrics-listen 127.0.0.1:7171 is the gRPC address (--listen)"),
    ],
)
def test_serve_refuses_a_bad_metrics_listen_before_listening(
    tmp_path: Path, value: str, words: str
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "percolake",
            "serve",
            "--store",
            "memory://",
            "--listen",
            "127.0.0.1:7171",
            "--metrics-listen",
            value,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert words in result.stderr, result.stderr
