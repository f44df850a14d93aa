"""Cassandra under clean-up tombstones and long version histories (issue 18 items 1, 2).

Item 1: versions of aborted writers are deleted, and Cassandra keeps each delete as a
tombstone for ``gc_grace_seconds``. A read that walks across more than
``tombstone_failure_threshold`` of them fails (``READ_TOO_MANY_TOMBSTONES``). The
format-1 layout scanned ``((tbl, shard), row, col, ts)`` partitions with ``GROUP BY``,
crossing every tombstone of the shard: 101,000 cleaned cells in one shard made every
scan of the table fail. The tests run on a node whose threshold is 1,000 instead of
100,000 (``cassandra_cluster_low_tombstones``): 8,000 cleaned versions here, in 4
shards, are twice the threshold in every shard, as 800,000 are on a default node. The benchmark
(``bench/bench_cassandra_history.py``) cleans a million on a default node.

Item 2: ``GROUP BY`` read every version of each cell it touched to return the newest.
The test counts the rows Cassandra reads (query tracing: "Read N live rows") for the
exact requests the store sends, so it checks the cost, not a timing.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from percolake.tools.cassandra import CassandraCluster
from storage_adapters import Cell, KVStore, ScanEntry, Version, VersionWrite, open_store
from storage_adapters.cassandra import CassandraStore
from tests.cassandra_plugin import LOW_TOMBSTONE_FAILURE_THRESHOLD

pytestmark = [pytest.mark.integration, pytest.mark.cassandra]

CLEANED = 8 * LOW_TOMBSTONE_FAILURE_THRESHOLD


@pytest.fixture
def low_tombstone_store(cassandra_cluster_low_tombstones: CassandraCluster) -> Iterator[KVStore]:
    """A fresh keyspace of 4 shards on the low-threshold node (2,000 tombstones a shard:
    twice the threshold)."""
    keyspace = f"percolake_tomb_{uuid.uuid4().hex[:12]}"
    store = open_store(cassandra_cluster_low_tombstones.store_url(keyspace, shards=4))
    yield store
    store.close()


def test_scans_and_reads_return_the_live_cells_after_cleaning_many_versions(
    low_tombstone_store: KVStore,
) -> None:
    """Failed before: every scan of the table raised ``StoreUnavailableError``
    (``READ_TOO_MANY_TOMBSTONES``), where the memory store returns the live cells."""
    store = low_tombstone_store
    live = {Cell(f"row{i:06d}".encode(), b"c"): f"v{i}".encode() for i in range(0, CLEANED, 400)}
    store.put_versions("t", [VersionWrite(c.row, c.column, 1, v) for c, v in live.items()])
    # 8,000 aborted writers' versions: cells of their own, and above every live one.
    doomed = [(f"row{i:06d}".encode(), b"c", 10) for i in range(CLEANED)]
    store.put_versions("t", [VersionWrite(r, c, ts, b"aborted") for r, c, ts in doomed])
    store.delete_versions("t", doomed)

    expected = [ScanEntry(c.row, c.column, 1, v) for c, v in sorted(live.items())]
    assert list(store.scan("t", b"", None, 100)) == expected
    assert list(store.scan("t", b"", None, 100, page_size=7)) == expected
    assert list(store.scan("t", b"row000400", b"row001200", 100)) == expected[1:3]
    cells = [(r, c) for r, c, _ in doomed[:2000]]
    assert store.get_latest("t", cells, 100) == {
        c: Version(1, v) for c, v in live.items() if c.row < b"row002000"
    }
    assert store.get_version_timestamps("t", cells[:800]) == {
        c: [1] for c in live if c.row < b"row000800"
    }


def test_a_scan_reads_no_tombstones_of_cells_it_does_not_return(
    low_tombstone_store: KVStore,
) -> None:
    """Cells whose every version was cleaned cost a scan nothing but their index row:
    a table of 8,000 such cells scans empty (failed before, as above)."""
    store = low_tombstone_store
    doomed = [(f"gone{i:06d}".encode(), f"col{i % 3}".encode(), 5 + i % 2) for i in range(CLEANED)]
    store.put_versions("u", [VersionWrite(r, c, ts, None) for r, c, ts in doomed])
    store.delete_versions("u", doomed)
    assert list(store.scan("u", b"", None, 1_000)) == []
    store.put_versions("u", [VersionWrite(b"gone000007", b"col1", 20, b"back")])
    assert list(store.scan("u", b"", None, 1_000)) == [
        ScanEntry(b"gone000007", b"col1", 20, b"back")
    ]


# --- item 2: reads cost O(cells), not O(versions) -------------------------------------

_READ_ROWS = re.compile(r"Read (\d+) live rows and (\d+) tombstone cells")


class _RecordingSession:
    """Passes every call to the real session and records each SELECT it sends."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.selects: list[tuple[Any, Any]] = []

    def _record(self, statement: Any, params: Any) -> None:
        query = getattr(statement, "query_string", "")
        if query.lstrip().upper().startswith("SELECT"):
            self.selects.append((statement, params))

    def execute(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        self._record(statement, params)
        return self._session.execute(statement, params, **kwargs)

    def execute_async(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        self._record(statement, params)
        return self._session.execute_async(statement, params, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _rows_read(session: Any, selects: list[tuple[Any, Any]]) -> int:
    """Rows (live and tombstones) Cassandra reads to answer these requests, by tracing
    each one again ("Read N live rows and M tombstone cells", once per partition read)."""
    total = 0
    for statement, params in selects:
        result = session.execute(statement, params, trace=True)
        list(result)  # every page
        for trace in result.get_all_query_traces(max_wait_sec_per=30):
            for event in trace.events:
                found = _READ_ROWS.search(event.description)
                if found:
                    total += int(found.group(1)) + int(found.group(2))
    return total


def test_reading_the_newest_version_does_not_read_the_older_ones(
    cassandra_store_url: str,
) -> None:
    """One cell holds 20,000 versions. ``get_latest`` of several cells, a scan and a
    conflict check's newest-first page read a handful of rows each (counted by
    Cassandra's tracing), not the cell's history. Failed before: the ``GROUP BY``
    reads of ``get_latest`` and ``scan`` each read all 20,000 versions (460 ms for a
    scan of a 60,000-version cell on the reviewer's cluster)."""
    store = open_store(cassandra_store_url)
    try:
        assert isinstance(store, CassandraStore)
        history = 20_000
        hot = Cell(b"head", b"log")
        store.put_versions(
            "t", [VersionWrite(hot.row, hot.column, ts, b"%d" % ts) for ts in range(1, history + 1)]
        )
        others = [Cell(b"head", b"other"), *(Cell(b"x%d" % i, b"log") for i in range(3))]
        store.put_versions("t", [VersionWrite(c.row, c.column, 7, b"o") for c in others])
        recorder = _RecordingSession(store._session)
        real, store._session = store._session, recorder
        try:
            latest = store.get_latest("t", [hot, *others], history + 1)
            assert latest[hot] == Version(history, b"%d" % history) and len(latest) == 5
            assert store.get_latest("t", [hot, others[0]], 5_000)[hot].ts == 4_999
            scanned = list(store.scan("t", b"", None, history + 1))
            assert [(e.row, e.column, e.ts) for e in scanned][:2] == [
                (b"head", b"log", history),
                (b"head", b"other", 7),
            ]
            stamps = store.get_version_timestamps("t", [hot, others[0]], limit=3)
            assert stamps[hot] == [history, history - 1, history - 2]
        finally:
            store._session = real
        cells_returned = 5 + 2 + len(scanned) + 2
        rows_read = _rows_read(real, recorder.selects)
        # Each cell costs its newest version, plus its index row when scanned: a few
        # rows per cell, whatever the history. Before, about 3 * 20,000.
        assert rows_read <= 4 * cells_returned + 3, (rows_read, recorder.selects)
    finally:
        store.close()


# --- layout ---------------------------------------------------------------------------

_FORMAT_1_DDL = (
    "CREATE TABLE {ks}.versions (tbl text, shard int, row blob, col blob, ts bigint, "
    "value blob, deleted boolean, PRIMARY KEY ((tbl, shard), row, col, ts)) "
    "WITH CLUSTERING ORDER BY (row ASC, col ASC, ts DESC)",
    "CREATE TABLE {ks}.system_rows (tbl text, key blob, value blob, PRIMARY KEY ((tbl, key)))",
    "CREATE TABLE {ks}.store_meta (name text PRIMARY KEY, value text)",
    "INSERT INTO {ks}.store_meta (name, value) VALUES ('format', '1')",
    "INSERT INTO {ks}.store_meta (name, value) VALUES ('shards', '32')",
)


def test_a_keyspace_of_the_format_1_layout_is_refused_by_name(
    cassandra_cluster: CassandraCluster,
) -> None:
    """A keyspace written by an older percolake is never read through the new tables
    (it would look empty) nor half-converted: opening it names the problem."""
    from tests.cassandra_plugin import _session

    keyspace = f"percolake_format1_{uuid.uuid4().hex[:8]}"
    session = _session(tuple(cassandra_cluster.contact_points), cassandra_cluster.port)
    session.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    for statement in _FORMAT_1_DDL:
        session.execute(statement.format(ks=keyspace))
    try:
        with pytest.raises(ValueError, match=r"format 1.*versions.*GROUP BY"):
            open_store(cassandra_cluster.store_url(keyspace))
        tables = session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
        )
        assert sorted(r[0] for r in tables) == ["store_meta", "system_rows", "versions"]
    finally:
        session.execute(f"DROP KEYSPACE {keyspace}")


def _table_options(store: CassandraStore) -> dict[str, Any]:
    return {
        r[0]: r
        for r in store._session.execute(
            "SELECT table_name, gc_grace_seconds, compaction, memtable_flush_period_in_ms "
            "FROM system_schema.tables WHERE keyspace_name = %s",
            (store.settings.keyspace,),
        )
    }


def _assert_index_options(index: Any) -> None:
    """The ``cells`` index: a prune's tombstones go at the first compaction after a
    flush, and a quiet index is flushed each minute (storage.md, "Pruning the index")."""
    assert index[1] == 0
    assert index[2]["class"].endswith("LeveledCompactionStrategy")
    assert index[2]["unchecked_tombstone_compaction"] == "true"
    assert index[2]["tombstone_compaction_interval"] == "60"
    assert index[3] == 60_000


def test_table_options_are_chosen_for_tombstones_and_reads(cassandra_store_url: str) -> None:
    """The options the module docstring explains, as the server has them."""
    store = open_store(cassandra_store_url)
    try:
        assert isinstance(store, CassandraStore)
        rows = _table_options(store)
        versions = rows["cell_versions"]
        assert versions[1] == 3600
        assert versions[2]["class"].endswith("LeveledCompactionStrategy")
        assert versions[2]["unchecked_tombstone_compaction"] == "true"
        assert versions[2]["tombstone_compaction_interval"] == "3600"
        _assert_index_options(rows["cells"])
    finally:
        store.close()


def test_an_index_made_before_its_tombstones_went_early_gets_the_new_options(
    cassandra_store_url: str,
) -> None:
    """A keyspace whose ``cells`` table kept prune tombstones an hour (the options
    before) is given the index options when a store opens it; its rows stay."""
    store = open_store(cassandra_store_url)
    assert isinstance(store, CassandraStore)
    try:
        store.put_versions("t", [VersionWrite(b"r", b"c", 5, b"v")])
        store._session.execute(
            f"ALTER TABLE {store.settings.keyspace}.cells WITH gc_grace_seconds = 3600 "
            "AND memtable_flush_period_in_ms = 0 AND compaction = {'class': "
            "'LeveledCompactionStrategy', 'unchecked_tombstone_compaction': 'true', "
            "'tombstone_compaction_interval': '3600'}"
        )
        assert _table_options(store)["cells"][1] == 3600
    finally:
        store.close()
    reopened = open_store(cassandra_store_url)
    assert isinstance(reopened, CassandraStore)
    try:
        _assert_index_options(_table_options(reopened)["cells"])
        assert list(reopened.scan("t", b"", None, 10)) == [ScanEntry(b"r", b"c", 5, b"v")]
    finally:
        reopened.close()
