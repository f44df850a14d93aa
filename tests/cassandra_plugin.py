"""Pytest plugin: one real Apache Cassandra node for the session, an empty store per test.

``cassandra_cluster`` (session) starts a node through ``percolake.tools.cassandra`` in a
temporary directory on free ports (fetching the jars into the shared cache the first
time, which takes about half a minute) and stops it when the session ends.

``cassandra_store_url`` (function) is the URL of an empty store. Stores come from a
small pool of keyspaces, used in turn and wiped (``TRUNCATE``) in the background once
their test is over (``KeyspacePool``): a truncate costs less than a fresh keyspace
(~0.5 s to create plus ~0.4 s to drop), and rotating the pool keeps a write still in
flight from the previous test (a background cleaner, say) out of the next test's
keyspace.

Set ``PERCOLAKE_SKIP_CASSANDRA=1`` to skip Cassandra tests on a machine without Java 17
and Maven; otherwise a node that cannot start fails them, loudly.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from percolake.tools.cassandra import CassandraCluster, CassandraError, start_on_free_ports

log = logging.getLogger(__name__)

#: Keyspaces rotated through by ``cassandra_store_url``.
POOL_SIZE = 3
POOL_PREFIX = "percolake_test_"

# A loaded two-core machine can stall a node for longer than Cassandra's default
# 2 s write and 1.8 s contention timeouts; timeouts still fire, just not spuriously.
TEST_NODE_YAML = {
    "write_request_timeout": "5000ms",
    "cas_contention_timeout": "5000ms",
    "read_request_timeout": "10000ms",
    "range_request_timeout": "10000ms",
    "truncate_request_timeout": "60000ms",
}

#: A node whose reads fail past 1,000 tombstones (Cassandra's default: 100,000), so a
#: test cleaning tens of thousands of versions meets the failure mode a production table
#: meets after millions (issue 18 item 1).
LOW_TOMBSTONE_YAML = {
    **TEST_NODE_YAML,
    "tombstone_warn_threshold": 500,
    "tombstone_failure_threshold": 1000,
}
LOW_TOMBSTONE_FAILURE_THRESHOLD = 1000

_sessions: dict[tuple[tuple[str, ...], int], Any] = {}
_sessions_lock = threading.Lock()


def _start_node(
    tmp_path_factory: pytest.TempPathFactory, name: str, extra_yaml: dict[str, str]
) -> Iterator[CassandraCluster]:
    if os.environ.get("PERCOLAKE_SKIP_CASSANDRA"):
        pytest.skip("PERCOLAKE_SKIP_CASSANDRA is set")
    cluster = start_on_free_ports(
        1, tmp_path_factory.mktemp(name), cluster_name=name, extra_yaml=extra_yaml
    )
    try:
        yield cluster
    finally:
        close_sessions()
        discard(cluster)


def discard(cluster: CassandraCluster) -> None:
    """Stop a test cluster whose data nobody keeps: SIGKILL, not a graceful drain.

    A graceful stop flushes memtables and drains, 5-15 s a node on a busy machine,
    for data thrown away a moment later; the launcher's own tests cover ``stop``.
    """
    for index in range(1, cluster.layout.nodes + 1):
        with contextlib.suppress(CassandraError):  # already down
            cluster.kill_node(index, signal.SIGKILL)
    cluster.stop()  # reaps the processes and removes their pid files


@pytest.fixture(scope="session")
def cassandra_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CassandraCluster]:
    """One real Cassandra node on 127.0.0.1, free ports, for the whole session.

    It runs Paxos v2 (the launcher's default: half the round trips of v1)."""
    yield from _start_node(tmp_path_factory, "percolake-test", TEST_NODE_YAML)


@pytest.fixture(scope="session")
def cassandra_cluster_paxos_v1(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CassandraCluster]:
    """A second node running Paxos v1, the server's own default, which clusters in the
    field run: its lightweight transactions fail differently (an ``Unavailable`` or
    ``CAS_WRITE_UNKNOWN`` after a proposal was accepted), so the store contract and the
    differential state machine run on it too (issue 18).

    Its reads fail after ``LOW_TOMBSTONE_FAILURE_THRESHOLD`` tombstones (it is also
    ``cassandra_cluster_low_tombstones``): every suite that runs here then shows it
    reads no more tombstones than that, and a third node no longer starts for the
    clean-up tests (issue 29's suite time: ~20 s of both cores)."""
    yield from _start_node(
        tmp_path_factory, "percolake-test-paxos-v1", {**LOW_TOMBSTONE_YAML, "paxos_variant": "v1"}
    )


@pytest.fixture(scope="session")
def cassandra_cluster_low_tombstones(
    cassandra_cluster_paxos_v1: CassandraCluster,
) -> CassandraCluster:
    """A node whose reads fail after ``LOW_TOMBSTONE_FAILURE_THRESHOLD`` tombstones
    (``READ_TOO_MANY_TOMBSTONES``): the clean-up tests prove at a small scale what the
    benchmark shows at a million cleaned versions. The Paxos v1 node: tests that take
    it use keyspaces of their own, and the one that pauses it resumes it before it
    ends (tests of a group run one at a time)."""
    return cassandra_cluster_paxos_v1


class KeyspacePool:
    """Keyspaces handed out in turn, each empty when it is handed out.

    A keyspace its test released (:meth:`release`, at the test's teardown) is wiped in
    a background thread while the next tests run in the others (issue 29's suite time:
    three TRUNCATEs flush three memtables, 0.2-0.5 s a test on a busy machine,
    ~400 tests), and :meth:`next_empty_url` waits for that wipe before handing it out
    again. One handed out and never released is wiped before it is handed out again,
    as every keyspace was before.
    """

    def __init__(self, cluster: CassandraCluster, size: int = POOL_SIZE) -> None:
        from storage_adapters import open_store

        self._cluster = cluster
        self._urls = [cluster.store_url(f"{POOL_PREFIX}{i}") for i in range(size)]
        for url in self._urls:  # creates keyspace and tables once
            open_store(url).close()
        self._turn = itertools.cycle(self._urls)
        self._wiper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keyspace-wipe")
        #: Per keyspace: None (empty), IN_USE, or the Future of its wipe.
        self._state: dict[str, Future[None] | str | None] = dict.fromkeys(self._urls)

    def next_empty_url(self) -> str:
        url = next(self._turn)
        state = self._state[url]
        if state == IN_USE:
            wipe_store(url)
        elif isinstance(state, Future):
            state.result()  # a failed wipe fails the test that wanted the keyspace
        self._state[url] = IN_USE
        return url

    def release(self, url: str) -> None:
        """The test using ``url`` is over: wipe it in the background."""
        if self._state.get(url) == IN_USE:
            self._state[url] = self._wiper.submit(wipe_store, url)

    def close(self) -> None:
        """Let the wipes under way finish (before the node goes)."""
        self._wiper.shutdown(wait=True)


#: ``KeyspacePool``'s mark of a keyspace handed out and not yet released.
IN_USE = "in use"


@pytest.fixture(scope="session")
def cassandra_keyspace_pool(cassandra_cluster: CassandraCluster) -> Iterator[KeyspacePool]:
    pool = KeyspacePool(cassandra_cluster)
    yield pool
    pool.close()


def _empty_store_url(request: pytest.FixtureRequest, pool_fixture: str) -> str:
    """An empty store from ``pool_fixture``, for a test that joined the node's worker.

    Under pytest-xdist each worker has its own session nodes; tests/conftest.py sends
    every test that needs one to the ``cassandra`` group, judging by fixture and
    parameter names. A test that reaches the node another way (``getfixturevalue``
    with parameters named otherwise) would silently start a second set of nodes in
    another worker, so it fails here, before any node starts, naming the fix.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") and not any(
        mark.args == ("cassandra",) for mark in request.node.iter_markers("xdist_group")
    ):
        pytest.fail(
            f"{request.node.nodeid} reaches the session's Cassandra node but is not in "
            "the 'cassandra' xdist group: take a cassandra_* fixture, or name the "
            "parameter that selects the node 'cassandra...' (tests/conftest.py, _shared_jvm)"
        )
    pool: KeyspacePool = request.getfixturevalue(pool_fixture)
    url = pool.next_empty_url()
    request.addfinalizer(lambda: pool.release(url))
    return url


@pytest.fixture
def cassandra_store_url(request: pytest.FixtureRequest) -> str:
    """``cassandra://127.0.0.1:PORT/KEYSPACE`` of an empty store."""
    return _empty_store_url(request, "cassandra_keyspace_pool")


@pytest.fixture(scope="session")
def cassandra_paxos_v1_keyspace_pool(
    cassandra_cluster_paxos_v1: CassandraCluster,
) -> Iterator[KeyspacePool]:
    pool = KeyspacePool(cassandra_cluster_paxos_v1)
    yield pool
    pool.close()


@pytest.fixture
def cassandra_paxos_v1_store_url(request: pytest.FixtureRequest) -> str:
    """An empty store on the Paxos v1 node."""
    return _empty_store_url(request, "cassandra_paxos_v1_keyspace_pool")


def wipe_store(url: str) -> None:
    """Empty the store at ``url``: truncate every table but ``store_meta``.

    The shard count and layout format (``store_meta``) are kept: they are the
    keyspace's, not the data's. Every other table is data, whatever the layout.
    """
    from storage_adapters.cassandra import parse_cassandra_url

    settings = parse_cassandra_url(url)
    session = _session(settings.hosts, settings.port)
    keyspace = '"' + settings.keyspace + '"'
    tables = [
        row[0]
        for row in session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
            (settings.keyspace,),
        )
        if row[0] != "store_meta"
    ]
    futures = [
        session.execute_async(f'TRUNCATE {keyspace}."{table}"', timeout=120) for table in tables
    ]
    for future in futures:
        future.result()


def _session(hosts: tuple[str, ...], port: int) -> Any:
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy

    key = (hosts, port)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None:
            profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy())
            cluster = Cluster(
                list(hosts),
                port=port,
                protocol_version=5,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            )
            session = _sessions[key] = cluster.connect()
        return session


def close_sessions() -> None:
    """Shut down the driver sessions ``wipe_store`` opened."""
    with _sessions_lock:
        for session in _sessions.values():
            session.cluster.shutdown()
        _sessions.clear()


def node_log(cluster: CassandraCluster, index: int = 1) -> Path:
    """The node's ``system.log``, to attach to a failure report."""
    return cluster.layout.node_dir(index) / "logs" / "system.log"
