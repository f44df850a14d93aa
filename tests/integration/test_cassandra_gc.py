"""Garbage collection on a real Cassandra node (issue 17, rules S8 and S9): commit
stamps in the format-2 layout (added to keyspaces created before them), a pass that
sweeps and collects the transactions table, and reads unchanged above the safe point."""

from __future__ import annotations

import uuid

import pytest

from percolake.tools.cassandra import CassandraCluster
from storage_adapters import Cell, VersionStamp, VersionWrite, open_store
from txn import GarbageCollector, TransactionConfig, TransactionManager
from txn.errors import SnapshotTooOldError
from txn.tables import GC_TABLE, STATE_KEY, TXN_TABLE, GcState, txn_key

pytestmark = [pytest.mark.integration, pytest.mark.cassandra]

HOT = Cell(b"hot", b"c")


def test_a_keyspace_from_before_commit_stamps_gains_the_column(
    cassandra_cluster: CassandraCluster,
) -> None:
    from tests.cassandra_plugin import _session

    keyspace = f"percolake_stamps_{uuid.uuid4().hex[:8]}"
    url = cassandra_cluster.store_url(keyspace, shards=4)
    session = _session(tuple(cassandra_cluster.contact_points), cassandra_cluster.port)
    try:
        open_store(url).close()
        # cell_versions as format 2 created it before commit stamps (a column dropped and
        # added again would hide older writes' stamps: Cassandra remembers the drop).
        session.execute(f"DROP TABLE {keyspace}.cell_versions")
        session.execute(
            f"CREATE TABLE {keyspace}.cell_versions (tbl text, cell blob, ts bigint, "
            "value blob, deleted boolean, PRIMARY KEY ((tbl, cell), ts)) "
            "WITH CLUSTERING ORDER BY (ts DESC)"
        )
        store = open_store(url)  # finds the table without commit_ts and adds the column
        store.put_versions("t", [VersionWrite(b"r", b"c", 5, b"v")])
        store.close()
        store = open_store(url)
        try:
            store.stamp_versions("t", [VersionStamp(b"r", b"c", 5, 9)])
            assert store.get_latest("t", [(b"r", b"c")], 10)[Cell(b"r", b"c")].commit_ts == 9
        finally:
            store.close()
    finally:
        session.execute(f"DROP KEYSPACE {keyspace}")


def test_a_pass_on_cassandra_sweeps_stamps_and_collects_entries(cassandra_store_url: str) -> None:
    store = open_store(cassandra_store_url)
    store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
    store.close()
    tm = TransactionManager.embedded(
        cassandra_store_url,
        config=TransactionConfig(resolve_wait_ms=0, gc_publish_interval_ms=10**9),
    )
    try:
        writers = []
        for i in range(30):
            tx = tm.begin()
            tx.put("t", HOT.row, HOT.column, b"%d" % i)
            tx.put("t", b"row%02d" % i, b"c", b"x")
            tx.commit()
            writers.append(tx.start_ts)
        old = tm.begin()
        assert old.get("t", HOT.row, HOT.column) == b"29"

        report = GarbageCollector(
            tm.store, timestamps=tm._rt.timestamps, locks=tm.locks, retention_s=0, grace_ms=0
        ).run_once()

        assert report.versions_deleted == 29 and report.entries_deleted == 30
        versions = tm.store.get_versions("t", [HOT])[HOT]
        assert [(v.value, v.commit_ts is not None) for v in versions] == [(b"29", True)]
        rows = tm.store.get_system(TXN_TABLE, [txn_key(ts) for ts in writers])
        assert rows == {}
        tm._rt.resolver.clear_cache()  # a reader in another process knows nothing
        fresh = tm.begin()
        assert fresh.get("t", HOT.row, HOT.column) == b"29"
        assert len(list(fresh.scan("t"))) == 31
        with pytest.raises(SnapshotTooOldError):
            old.get("t", HOT.row, HOT.column)
        # A commit on the swept cell checks conflicts through the stamp.
        tx = tm.begin()
        tx.put("t", HOT.row, HOT.column, b"after")
        tx.commit()
        assert tm.begin().get("t", HOT.row, HOT.column) == b"after"
    finally:
        tm.close()


def test_an_entry_written_again_between_the_read_and_the_delete_stays(
    cassandra_store_url: str,
) -> None:
    """``delete_system_many`` deletes each row at the write time it read, without Paxos:
    a row deleted and written again between that read and the tombstone (a settler's
    ABORTED after another collector's delete) is a newer Paxos write, above the
    tombstone, and stays. The race made deterministic: the rewrite runs right after the
    read. Deleting ``USING TIMESTAMP`` the client's clock instead would remove it."""
    from storage_adapters.cassandra import CassandraStore

    store = open_store(cassandra_store_url)
    assert isinstance(store, CassandraStore)
    try:
        keys = [txn_key(ts) for ts in (101, 102, 103)]
        for key in keys:
            store.put_unless_exists(TXN_TABLE, key, b"committed")
        read = store._written_system

        def read_then_rewrite(table: str, wanted: list[bytes]) -> dict[bytes, tuple[bytes, int]]:
            found = read(table, wanted)
            assert store.delete_system(table, keys[1], b"committed").applied
            assert store.put_unless_exists(table, keys[1], b"aborted").applied
            return found

        store._written_system = read_then_rewrite  # type: ignore[method-assign]
        outcome = store.delete_system_many(TXN_TABLE, [(key, b"committed") for key in keys])
        del store._written_system
        assert outcome == [True, True, True]  # all three held it when read
        assert store.get_system(TXN_TABLE, keys) == {keys[1]: b"aborted"}
    finally:
        store.close()
