"""The garbage-collection benchmark's row count on a real Cassandra node (issue 27):
index rows of cells with no version left count as rows, those of live cells are only
reported, as SQLite keeps their counterpart inside its versions' primary key."""

from __future__ import annotations

import pytest

from bench.bench_gc import cassandra_size
from storage_adapters import VersionWrite, open_store
from storage_adapters.cassandra import CassandraStore

pytestmark = [pytest.mark.integration, pytest.mark.cassandra]


def test_only_the_index_rows_of_dead_cells_count(cassandra_store_url: str) -> None:
    store = open_store(cassandra_store_url)
    assert isinstance(store, CassandraStore)
    try:
        cells = [(b"r%03d" % i, b"c") for i in range(30)]
        store.put_versions("t", [VersionWrite(r, c, 10, b"x") for r, c in cells])
        store.put_versions("t", [VersionWrite(r, c, 20, b"y") for r, c in cells[:5]])
        store.put_versions("u", [VersionWrite(b"r000", b"c", 10, b"x")])
        store.delete_versions("t", [(r, c, 10) for r, c in cells[20:]])
        size = cassandra_size(store)
        assert (size.versions, size.index, size.live_index) == (26, 10, 21)
        assert size.rows == 26 + size.entries + size.system + 10
        assert dict(size.by_table) == {"t": 25, "u": 1}
        store.prune_cells("t", 11)
        assert (cassandra_size(store).index, cassandra_size(store).live_index) == (0, 21)
    finally:
        store.close()
