"""Health of a real ``percolake serve`` on a real Cassandra node that stops answering
(issue 31, item 1): NOT_SERVING while the node is stopped, SERVING again once it
answers, and transactions commit again.

The node is the session's low-tombstone node (only the clean-up tests use it, and they
run before this file), stopped with SIGSTOP: a hung node, which every connection
still reaches and nothing answers; SIGCONT resumes it at once, so the test costs
seconds where a restart would cost a driver reconnection back-off of up to a minute.
"""

from __future__ import annotations

import signal
import time

import pytest
from grpc_health.v1 import health_pb2

from percolake.tools.cassandra.launcher import CassandraCluster
from tests.integration.test_health import NOT_SERVING, SERVING, TXN, check
from tests.servers import ServerProcess
from txn import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.cassandra]

#: Bound of each wait below (never a timing assertion): a paused node is noticed when
#: the store's requests time out.
_WAIT_S = 90.0


def _wait_for(address: str, status: int, service: str = "") -> None:
    deadline = time.monotonic() + _WAIT_S
    while check(address, service) != status:
        if time.monotonic() > deadline:
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            raise AssertionError(f"{service or 'the server'} never became {name}")
        time.sleep(0.2)


def test_health_is_not_serving_while_the_cassandra_node_is_stopped(
    cassandra_cluster_low_tombstones: CassandraCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Fails on the code before issue 31: health said SERVING while the store was
    stopped and every ``Begin`` failed after 60 s."""
    cluster = cassandra_cluster_low_tombstones
    workdir = tmp_path_factory.mktemp("health-cassandra")
    url = cluster.store_url("health_probe")
    server = ServerProcess("all", ["--store", url, "--leader-lease-ms", "1000"], workdir).start()
    try:
        _wait_for(server.address, SERVING)
        cluster.kill_node(1, signal.SIGSTOP)
        try:
            _wait_for(server.address, NOT_SERVING)
            assert check(server.address, TXN) == NOT_SERVING
        finally:
            cluster.kill_node(1, signal.SIGCONT)
        _wait_for(server.address, SERVING)
        _wait_for(server.address, SERVING, TXN)
        client = TransactionManager.remote(server.address, timeout_s=30)
        try:
            with client.begin() as tx:
                tx.put("t", b"r", b"c", b"after the outage")
        finally:
            client.close()
    finally:
        server.stop()
