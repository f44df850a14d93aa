"""The ``cells`` index prune and range deletes on a real Cassandra node (issue 27): the
index rows of dead cells really go (counted in the table itself), a writer racing the
prune in another thread is never hidden, and a garbage-collection pass prunes the cells
it emptied and deletes a cell's history with range deletes."""

from __future__ import annotations

import threading

import pytest

from storage_adapters import MAX_TIMESTAMP, Cell, VersionWrite, open_store
from storage_adapters.cassandra import CassandraStore
from txn import GarbageCollector, TransactionConfig, TransactionManager
from txn.tables import GC_TABLE, STATE_KEY, GcState

pytestmark = [pytest.mark.integration, pytest.mark.cassandra]


def _index_rows(store: CassandraStore, table: str) -> int:
    """Live rows of ``table`` in the ``cells`` index, every shard."""
    keyspace = '"' + store.settings.keyspace + '"'
    statement = store._session.prepare(
        f"SELECT COUNT(*) FROM {keyspace}.cells WHERE tbl = ? AND shard = ?"
    )
    return sum(store._session.execute(statement, (table, s)).one()[0] for s in range(store.shards))


def test_a_prune_drops_the_index_rows_of_dead_cells_only(cassandra_store_url: str) -> None:
    store = open_store(cassandra_store_url)
    assert isinstance(store, CassandraStore)
    try:
        dead = [(b"d%04d" % i, b"c") for i in range(500)]
        live = [(b"d%04d" % i, b"live") for i in (0, 250, 499)]
        store.put_versions("t", [VersionWrite(r, c, 10, b"x") for r, c in dead + live])
        store.delete_versions("t", [(r, c, 10) for r, c in dead])
        assert _index_rows(store, "t") == 503
        assert store.prune_cells("t", 11) == 500
        assert _index_rows(store, "t") == 3
        assert [(e.row, e.column) for e in store.scan("t", b"", None, MAX_TIMESTAMP)] == live
    finally:
        store.close()


def test_writers_racing_a_prune_in_another_thread_are_all_scanned(cassandra_store_url: str) -> None:
    """Dead cells everywhere; while a prune at 100 runs, another thread writes versions
    at or above 100 to dead cells and to new cells among them. Every one is scanned."""
    store = open_store(cassandra_store_url)
    assert isinstance(store, CassandraStore)
    try:
        dead = [(b"d%05d" % i, b"c") for i in range(0, 6000, 2)]
        store.put_versions("t", [VersionWrite(r, c, 5, b"x") for r, c in dead])
        store.delete_versions("t", [(r, c, 5) for r, c in dead])
        written: list[tuple[bytes, bytes]] = []
        started = threading.Event()

        def write() -> None:
            started.wait()
            for i in range(0, 6000, 60):
                cells = [(b"d%05d" % i, b"c"), (b"d%05d" % (i + 1), b"c")]
                store.put_versions("t", [VersionWrite(r, c, 100 + i, b"new") for r, c in cells])
                written.extend(cells)

        writer = threading.Thread(target=write)
        writer.start()
        started.set()
        store.prune_cells("t", 100)
        writer.join()
        scanned = [(e.row, e.column) for e in store.scan("t", b"", None, MAX_TIMESTAMP)]
        assert scanned == sorted(written)
        assert len(written) == 200
    finally:
        store.close()


def test_a_pass_deletes_ranges_and_prunes_the_cells_it_emptied(cassandra_store_url: str) -> None:
    store = open_store(cassandra_store_url)
    store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
    store.close()
    tm = TransactionManager.embedded(
        cassandra_store_url,
        config=TransactionConfig(resolve_wait_ms=0, gc_publish_interval_ms=10**9),
    )
    try:
        for i in range(40):
            tx = tm.begin()
            tx.put("t", b"hot", b"c", b"%d" % i)
            tx.put("t", b"gone%02d" % i, b"c", b"x")
            tx.commit()
        tx = tm.begin()
        for i in range(40):
            tx.delete("t", b"gone%02d" % i, b"c")
        tx.commit()
        store = tm.store
        assert isinstance(store, CassandraStore)
        assert _index_rows(store, "t") == 41

        report = GarbageCollector(
            store, timestamps=tm._rt.timestamps, locks=tm.locks, retention_s=0, grace_ms=0
        ).run_once()

        # 39 older versions of the hot cell; each gone cell's value and its delete.
        assert report.versions_deleted == 39 + 80
        assert report.cells_pruned == 40
        assert _index_rows(store, "t") == 1
        hot = Cell(b"hot", b"c")
        assert [v.value for v in store.get_versions("t", [hot])[hot]] == [b"39"]
        assert list(tm.begin().scan("t")) == [(b"hot", b"c", b"39")]
        tx = tm.begin()
        tx.put("t", b"gone07", b"c", b"back")
        tx.commit()
        assert (b"gone07", b"c", b"back") in list(tm.begin().scan("t"))
    finally:
        tm.close()
