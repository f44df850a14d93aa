"""The Cassandra launcher and the ``cassandra://`` backend against real nodes.

Against the session's real node (``tests.cassandra_plugin``): ordered scans across
shards, partition sizes, lightweight-transaction semantics, the command line; and
(slow) a three-node cluster losing nodes. What needs no server is in the unit tier:
``tests/unit/test_cassandra_url.py`` (URL parsing, ``shard_of``),
``tests/unit/test_cassandra_errors.py`` (error translation and the conditional-write
retry policy, rule S6) and ``tests/unit/test_cassandra_launcher_config.py`` (node
configuration, the command-line parser).
"""

from __future__ import annotations

import argparse
import io
import itertools
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from percolake.tools.cassandra import CassandraCluster, main, start_on_free_ports
from percolake.tools.cassandra.launcher import DEFAULT_VERSION
from percolake.tools.ports import free_ports
from storage_adapters import (
    MAX_TIMESTAMP,
    Cell,
    KVStore,
    ScanEntry,
    StoreTimeoutError,
    StoreUnavailableError,
    Version,
    VersionWrite,
    open_store,
)
from storage_adapters.cassandra import CassandraStore, parse_cassandra_url, shard_of
from tests.cassandra_plugin import TEST_NODE_YAML, KeyspacePool, discard

# --- against the session's real node -------------------------------------------------------


@pytest.fixture
def store(cassandra_store_url: str) -> Iterator[KVStore]:
    s = open_store(cassandra_store_url)
    yield s
    s.close()


@pytest.mark.integration
@pytest.mark.cassandra
def test_node_is_up_and_is_cassandra_5(cassandra_cluster: CassandraCluster) -> None:
    (status,) = cassandra_cluster.status()
    assert status.process_alive and status.cql_ready and status.pid
    store = open_store(cassandra_cluster.store_url("percolake_test_0"))
    try:
        assert isinstance(store, CassandraStore)
        rows = store._session.execute("SELECT release_version FROM system.local")
        assert rows.one()[0].startswith(DEFAULT_VERSION.rsplit(".", 1)[0])
    finally:
        store.close()


@pytest.mark.integration
@pytest.mark.cassandra
def test_scan_is_in_key_order_across_every_shard(store: KVStore) -> None:
    rnd = random.Random(7)
    rows = sorted({rnd.randbytes(rnd.randint(1, 12)) for _ in range(3000)})
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    store.put_versions("t", [VersionWrite(r, c, 5, r + c) for r in shuffled for c in (b"a", b"b")])
    assert isinstance(store, CassandraStore)
    assert len({shard_of(r, store.shards) for r in rows}) == store.shards
    expected = [ScanEntry(r, c, 5, r + c) for r in rows for c in (b"a", b"b")]
    for page_size in (37, 1000, 10_000):
        got = list(store.scan("t", b"", None, MAX_TIMESTAMP, page_size=page_size))
        assert got == expected, page_size
    # One entry a page, over a range wide enough to cross every shard's boundary many
    # times: the whole table a page at a time is 6,000 round trips (40 s of the suite).
    lo, hi = rows[1000], rows[1200]
    window = [e for e in expected if lo <= e.row < hi]
    assert len({shard_of(e.row, store.shards) for e in window}) == store.shards
    assert list(store.scan("t", lo, hi, MAX_TIMESTAMP, page_size=1)) == window
    lo, hi = rows[500], rows[2500]
    middle = [e for e in expected if lo <= e.row < hi and (e.row, e.column) >= (lo, b"b")]
    assert list(store.scan("t", lo, hi, 6, start_column=b"b", page_size=64)) == middle
    assert list(store.scan("t", b"", None, 5)) == []  # nothing below ts 5


@pytest.mark.integration
@pytest.mark.cassandra
def test_scan_of_one_row_reads_only_its_shard(store: KVStore) -> None:
    store.put_versions("t", [VersionWrite(b"row", bytes([c]), 1, b"v") for c in range(1, 50)])
    store.put_versions("t", [VersionWrite(b"row\x00", b"c", 1, b"next row")])
    got = list(store.scan("t", b"row", b"row\x00", 2, page_size=7))
    assert [e.column for e in got] == [bytes([c]) for c in range(1, 50)]


@pytest.mark.integration
@pytest.mark.cassandra
def test_batched_reads_keep_limits_per_cell_within_one_partition(store: KVStore) -> None:
    """Cells of one partition are read with one query; a deep cell must not crowd out others."""
    assert isinstance(store, CassandraStore)
    candidates = (f"row{i}".encode() for i in itertools.count())
    shard = shard_of(b"deep", store.shards)
    rows = list(itertools.islice((r for r in candidates if shard_of(r, store.shards) == shard), 3))
    store.put_versions("t", [VersionWrite(b"deep", b"c", ts, b"v") for ts in range(1, 41)])
    store.put_versions("t", [VersionWrite(r, b"c", 5 + i, b"w") for i, r in enumerate(rows)])
    store.put_versions("t", [VersionWrite(rows[0], b"d", 3, None)])
    cells = [(b"deep", b"c"), *((r, b"c") for r in rows), (rows[0], b"d"), (b"absent", b"c")]
    got = store.get_version_timestamps("t", cells, limit=2)
    assert got == {
        Cell(b"deep", b"c"): [40, 39],
        **{Cell(r, b"c"): [5 + i] for i, r in enumerate(rows)},
        Cell(rows[0], b"d"): [3],
    }
    assert store.get_version_timestamps("t", cells, above_ts=38)[Cell(b"deep", b"c")] == [40, 39]
    latest = store.get_latest("t", cells, 30)
    assert latest[Cell(b"deep", b"c")] == Version(29, b"v")
    assert latest[Cell(rows[0], b"d")] == Version(3, None)
    assert Cell(b"absent", b"c") not in latest and len(latest) == 5


@pytest.mark.integration
@pytest.mark.cassandra
def test_partitions_stay_bounded_as_a_table_grows(
    store: KVStore, cassandra_cluster: CassandraCluster
) -> None:
    assert isinstance(store, CassandraStore)
    n = 20_000
    store.put_versions("big", [VersionWrite(f"r{i:07d}".encode(), b"c", 1, b"x") for i in range(n)])
    count = store._session.prepare(
        f'SELECT COUNT(*) FROM "{store.settings.keyspace}".cells WHERE tbl = ? AND shard = ?'
    )
    sizes = [store._session.execute(count, ("big", s)).one()[0] for s in range(store.shards)]
    assert sum(sizes) == n
    # Each index partition holds ~1/shards of the table's cells: growth spreads, no hot
    # partition (versions live in one partition per cell).
    assert max(sizes) < 1.25 * n / store.shards


@pytest.mark.integration
@pytest.mark.cassandra
def test_shard_count_is_fixed_when_the_keyspace_is_created(
    cassandra_cluster: CassandraCluster,
) -> None:
    url = cassandra_cluster.store_url("percolake_shards_fixed", shards=4)
    with open_store(url) as first:
        assert isinstance(first, CassandraStore) and first.shards == 4
        first.put_versions("t", [VersionWrite(b"r", b"c", 1, b"v")])
    with open_store(cassandra_cluster.store_url("percolake_shards_fixed")) as second:
        assert isinstance(second, CassandraStore) and second.shards == 4
        assert [e.row for e in second.scan("t", b"", None, 2)] == [b"r"]
    with pytest.raises(ValueError, match="created with shards=4"):
        open_store(cassandra_cluster.store_url("percolake_shards_fixed", shards=8))


@pytest.mark.integration
@pytest.mark.cassandra
def test_keyspace_is_created_with_the_requested_replication(
    cassandra_cluster: CassandraCluster,
) -> None:
    with open_store(cassandra_cluster.store_url("percolake_rf", replication_factor=1)) as store:
        assert isinstance(store, CassandraStore)
        row = store._session.execute(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = 'percolake_rf'"
        ).one()
        assert row[0]["class"].endswith("NetworkTopologyStrategy")
        assert row[0]["datacenter1"] == "1"


@pytest.mark.integration
@pytest.mark.cassandra
def test_put_unless_exists_is_linearizable_under_contention(store: KVStore) -> None:
    """16 threads race on each of 5 keys: one winner per key, everyone sees it."""
    results: dict[bytes, list[tuple[bool, bytes | None, bytes]]] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def race(i: int) -> None:
        barrier.wait()
        for k in range(5):
            key, mine = f"k{k}".encode(), f"w{i}".encode()
            result = store.put_unless_exists("_txn", key, mine)
            with lock:
                results.setdefault(key, []).append((result.applied, result.current, mine))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = store.get_system("_txn", [f"k{k}".encode() for k in range(5)])
    for key, outcomes in results.items():
        winners = [mine for applied, _, mine in outcomes if applied]
        assert len(winners) == 1
        assert all(current == winners[0] for _, current, _ in outcomes)
        assert stored[key] == winners[0]


@pytest.mark.integration
@pytest.mark.cassandra
def test_compare_and_set_counter_loses_no_increment(store: KVStore) -> None:
    """A CAS retry loop from 4 threads: every increment lands exactly once."""
    store.put_unless_exists("_tso", b"n", b"0")

    def bump(times: int) -> None:
        for _ in range(times):
            while True:
                current = store.get_system("_tso", [b"n"])[b"n"]
                if store.compare_and_set("_tso", b"n", current, b"%d" % (int(current) + 1)).applied:
                    break

    threads = [threading.Thread(target=bump, args=(10,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get_system("_tso", [b"n"]) == {b"n": b"40"}


@pytest.mark.integration
@pytest.mark.cassandra
def test_two_handles_see_each_others_writes(cassandra_store_url: str) -> None:
    with open_store(cassandra_store_url) as a, open_store(cassandra_store_url) as b:
        a.put_versions("t", [VersionWrite(b"r", b"c", 3, b"v")])
        assert b.put_unless_exists("_txn", b"3", b"c:4").applied
        assert [e.value for e in b.scan("t", b"", None, 4)] == [b"v"]
        assert a.get_system("_txn", [b"3"]) == {b"3": b"c:4"}


@pytest.mark.integration
@pytest.mark.cassandra
def test_keyspace_pool_hands_out_empty_stores(cassandra_keyspace_pool: KeyspacePool) -> None:
    urls = [cassandra_keyspace_pool.next_empty_url() for _ in range(4)]
    assert urls[0] == urls[3] != urls[1]
    with open_store(urls[0]) as s:
        s.put_versions("t", [VersionWrite(b"r", b"c", 1, b"v")])
        s.put_unless_exists("_txn", b"k", b"v")
    for _ in range(3):
        url = cassandra_keyspace_pool.next_empty_url()
    assert url == urls[0]
    with open_store(url) as s:
        assert list(s.scan("t", b"", None, 5)) == [] and s.get_system("_txn", [b"k"]) == {}


@pytest.mark.integration
@pytest.mark.cassandra
def test_cli_starts_reports_and_stops_a_node_from_separate_calls(tmp_path: Path) -> None:
    native, storage, jmx = free_ports(3)
    base = str(tmp_path / "cli")
    started = time.monotonic()
    assert (
        main(
            [
                "start",
                "--dir",
                base,
                "--port",
                str(native),
                "--storage-port",
                str(storage),
                "--jmx-port",
                str(jmx),
            ]
        )
        == 0
    )
    try:
        startup_s = time.monotonic() - started
        assert startup_s < 120
        out = io.StringIO()
        status = argparse.Namespace(cassandra_command="status", dir=base)
        from percolake.tools.cassandra import run_cassandra_command

        assert run_cassandra_command(status, out) == 0
        assert f"127.0.0.1:{native}" in out.getvalue() and " up" in out.getvalue()
        # Another "process": a fresh object that only knows the directory.
        assert CassandraCluster.from_dir(base).status()[0].cql_ready
    finally:
        assert main(["stop", "--dir", base]) == 0
    (after,) = CassandraCluster.from_dir(base).status()
    assert not after.process_alive and not after.cql_ready
    assert main(["status", "--dir", base]) == 1


# --- three nodes (slow) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CassandraCluster]:
    cluster = start_on_free_ports(
        3,
        tmp_path_factory.mktemp("cassandra3"),
        cluster_name="percolake-test-3",
        first_address=11,  # 127.0.0.11-13: clear of the session's node on 127.0.0.1
        heap_mb=512,
        # Gossip convicts a killed node after ~5 s instead of ~10-15 s: the test waits
        # for that twice (Cassandra's own default, 8, is for real networks' jitter).
        # Requests to a dead replica time out after 2 s instead of 5-10 s: the test
        # retries through such timeouts until the survivors notice the loss.
        extra_yaml={
            **TEST_NODE_YAML,
            "phi_convict_threshold": 5,
            "write_request_timeout": "2000ms",
            "cas_contention_timeout": "2000ms",
            "read_request_timeout": "2000ms",
            "range_request_timeout": "2000ms",
        },
    )
    try:
        yield cluster
    finally:
        discard(cluster)


def _retry(fn: Any, *, deadline_s: float, expected: tuple[type[Exception], ...]) -> Any:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return fn()
        except expected:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.integration
@pytest.mark.cassandra
@pytest.mark.slow
def test_three_nodes_survive_one_loss_and_refuse_on_two(three_nodes: CassandraCluster) -> None:
    assert len(three_nodes.contact_points) == 3
    url = three_nodes.store_url("percolake_rf3", replication_factor=3, timeout_s=15)
    with open_store(url) as store:
        store.put_versions("t", [VersionWrite(b"r%d" % i, b"c", 1, b"v") for i in range(50)])
        assert store.put_unless_exists("_txn", b"1", b"c:2").applied

        three_nodes.kill_node(3, signal.SIGKILL)
        errors = (StoreTimeoutError, StoreUnavailableError)
        # A quorum (2 of 3) is left: conditional writes and QUORUM reads go on, once
        # the driver and the survivors notice the loss (timeouts until then).
        applied = _retry(
            lambda: store.put_unless_exists("_txn", b"2", b"c:3"), deadline_s=60, expected=errors
        )
        assert applied.current == b"c:3"
        assert (
            _retry(lambda: len(list(store.scan("t", b"", None, 2))), deadline_s=60, expected=errors)
            == 50
        )

        three_nodes.kill_node(2, signal.SIGKILL)
        # No quorum: once gossip marks node 2 down the coordinator refuses up front.
        deadline = time.monotonic() + 90
        outcome: Exception | None = None
        while time.monotonic() < deadline:
            try:
                store.put_unless_exists("_txn", b"3", b"c:4")
                raise AssertionError("a conditional write succeeded without a quorum")
            except StoreUnavailableError as exc:
                outcome = exc
                break
            except StoreTimeoutError as exc:  # outcome unknown until the loss is noticed
                outcome = exc
                time.sleep(0.5)
        assert isinstance(outcome, StoreUnavailableError), outcome
        with pytest.raises(StoreUnavailableError):
            store.get_system("_txn", [b"1"])

        three_nodes.start_node(2)
        # S6: key 3's earlier attempts timed out or were refused; with a quorum back
        # (nodes 1 and 2: node 3 stays down, a quorum is all it takes), a serial read
        # settles whether any of them applied, and re-issuing is safe.
        settled = _retry(
            lambda: store.put_unless_exists("_txn", b"3", b"c:4"), deadline_s=90, expected=errors
        )
        assert settled.current == b"c:4"
        assert store.get_system("_txn", [b"1", b"2", b"3"]) == {
            b"1": b"c:2",
            b"2": b"c:3",
            b"3": b"c:4",
        }


@pytest.mark.cassandra
def test_the_second_node_runs_paxos_v1_and_the_first_v2(
    cassandra_cluster: CassandraCluster, cassandra_cluster_paxos_v1: CassandraCluster
) -> None:
    """The store suites run on both Paxos variants only if the nodes really differ."""
    from cassandra.cluster import Cluster

    for cluster, variant in ((cassandra_cluster, "v2"), (cassandra_cluster_paxos_v1, "v1")):
        settings = parse_cassandra_url(cluster.store_url("percolake_test_0"))
        driver = Cluster(list(settings.hosts), port=settings.port, protocol_version=5)
        try:
            row = (
                driver.connect()
                .execute("SELECT value FROM system_views.settings WHERE name = 'paxos_variant'")
                .one()
            )
        finally:
            driver.shutdown()
        assert row is not None and row[0] == variant
