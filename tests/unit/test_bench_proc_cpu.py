"""What the benchmarks measure beside their rates: CPU from /proc (server processes
found by their listening sockets), and a gateway's commits per group."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from bench._proc_cpu import cpu_seconds, jit_cpu_seconds, listening_pids
from bench.bench_lakehouse_deployed import store_server_pids

pytestmark = pytest.mark.unit


def test_a_listening_socket_names_its_process_and_a_connected_one_does_not() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert os.getpid() in listening_pids({("127.0.0.1", port)})
        with socket.create_connection(("127.0.0.1", port)) as client:
            client_port = client.getsockname()[1]
            # A connected (not listening) socket's address names nobody.
            assert listening_pids({("127.0.0.1", client_port)}) == []
        assert listening_pids({("127.0.0.2", port)}) == []


def test_cpu_seconds_count_this_process_and_store_urls_name_their_servers() -> None:
    before = cpu_seconds([os.getpid()])
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert cpu_seconds([os.getpid()]) - before >= 0.25
    assert store_server_pids("sqlite:///tmp/x.db") == []  # no server: the gateway is the store
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        url = f"cassandra://127.0.0.2:{port},127.0.0.1:{port}/ks?replication_factor=3"
        assert store_server_pids(url) == [os.getpid()]


@contextlib.contextmanager
def _thread_that_burned(comm: bytes, seconds: float) -> Iterator[None]:
    """A live thread the kernel names ``comm`` that has spent ``seconds`` of CPU (a
    thread's CPU leaves /proc with it, so it waits until the block ends)."""
    burned, done = threading.Event(), threading.Event()

    def burn() -> None:
        pr_set_name = 15
        ctypes.CDLL(None).prctl(pr_set_name, ctypes.c_char_p(comm), 0, 0, 0)
        deadline = time.thread_time() + seconds
        while time.thread_time() < deadline:
            pass
        burned.set()
        done.wait(10)

    thread = threading.Thread(target=burn)
    thread.start()
    try:
        assert burned.wait(10)
        yield
    finally:
        done.set()
        thread.join()


def test_jit_cpu_counts_only_threads_named_as_a_jvm_names_its_compilers() -> None:
    pid = os.getpid()
    before = jit_cpu_seconds([pid])
    with _thread_that_burned(b"worker", 0.3):
        assert jit_cpu_seconds([pid]) - before < 0.05
    with _thread_that_burned(b"C2 CompilerThread0", 0.3):
        assert jit_cpu_seconds([pid]) - before >= 0.25


def test_cpu_figures_per_commit_of_each_role_and_their_sum() -> None:
    from collections import Counter

    from bench.bench_lakehouse_deployed import Run, _cpu_figures

    def run(commits: int, cpu_s: dict[str, float]) -> Run:
        return Run(8, commits, 1.0, 0, [], [], Counter(), cpu_s)

    runs = [run(100, {"store": 0.8, "gateway": 0.2, "writers": 0.1}), run(50, {"writers": 0.1})]
    # Only the roles every run measured; no sum of one role.
    assert [f.name for f in _cpu_figures(runs, "p", "a", "n")] == ["p.cpu_ms_per_commit.writers"]
    assert _cpu_figures([run(10, {})], "p", "a", "n") == []
    runs = [
        run(100, {"store": 0.8, "gateway": 0.2, "writers": 0.1}),
        run(200, {"store": 2.0, "gateway": 0.4, "writers": 0.2}),
    ]
    values = {f.name: f.value for f in _cpu_figures(runs, "p", "a", "n")}
    assert values == pytest.approx(
        {
            "p.cpu_ms_per_commit.store": 9.0,  # median of 8 and 10 ms
            "p.cpu_ms_per_commit.gateway": 2.0,
            "p.cpu_ms_per_commit.writers": 1.0,
            "p.cpu_ms_per_commit": 12.0,
        }
    )
    # The store's JIT part is a figure of its own, not added to the sum a second time.
    runs[0].jit_s, runs[1].jit_s = 0.3, 0.4
    values = {f.name: f.value for f in _cpu_figures(runs, "p", "a", "n")}
    assert values["p.cpu_ms_per_commit.store_jit"] == pytest.approx(2.5)  # median of 3 and 2
    assert values["p.cpu_ms_per_commit"] == pytest.approx(12.0)


def test_a_gateway_reports_its_commits_per_group_from_its_metrics_endpoint() -> None:
    from bench.bench_lakehouse_deployed import Gateway
    from wire import metrics

    server = metrics.MetricsServer("127.0.0.1", 0)
    try:
        gateway = Gateway("unused", metrics_port=server.port)
        commits, groups = gateway.group_commits()
        for size in (8, 8, 5):
            metrics.LAKEHOUSE_GROUP_COMMITS.observe(size)
        after = gateway.group_commits()
        assert (after[0] - commits, after[1] - groups) == (21.0, 3.0)
    finally:
        server.close()


def test_a_store_is_warm_once_its_rate_stops_climbing_with_little_jit() -> None:
    from bench.bench_lakehouse_deployed import is_warm

    assert not is_warm([100.0, 100.0], 0.0)  # too few runs to tell
    assert is_warm([50.0, 90.0, 95.0], 0.04)
    assert is_warm([50.0, 90.0, 80.0], 0.05)  # a slower run is not climbing
    assert not is_warm([50.0, 90.0, 95.0], 0.06)  # still compiling
    # A node that idled runs slow in the interpreter before it compiles again: a low
    # share with a climbing rate is not warm.
    assert not is_warm([40.0, 45.0, 60.0], 0.01)
