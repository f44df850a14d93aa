"""The raw-driver floor of a garbage-collection pass over one long cell (issue 27).

A pass over a cell of N committed versions (``bench_cassandra.gc_cell_figures``) must
at least delete the N - 1 versions below the newest and the N transactions-table
entries of their writers. With the raw driver, on plain tables of the same cluster and
no reads at all, the least that costs is one range delete in the cell's partition and
N row deletes by key, sent with ``execute_concurrent_with_args``: what this times. The
pass also reads each entry (its outcome, then its write time for the delete, see
docs/design/storage.md, "Deleting final rows") and checks the safe point; the
ratio ``cassandra.gc.cell_versionsN.pass.vs_raw_floor.ratio`` (floor time / pass
time) says what that costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from storage_adapters.cassandra import CONCURRENCY, CassandraStore


def raw_floor_seconds(
    store: CassandraStore, versions: int, progress: Callable[[str], None]
) -> float:
    """Seconds the raw driver takes to delete ``versions - 1`` versions of one cell with
    one range delete and ``versions`` entries by key (written first, not timed)."""
    from cassandra.concurrent import execute_concurrent_with_args

    session: Any = store._session
    keyspace = '"' + store.settings.keyspace + '"'
    for ddl in (
        f"CREATE TABLE IF NOT EXISTS {keyspace}.floor_versions "
        "(cell blob, ts bigint, value blob, PRIMARY KEY ((cell), ts))",
        f"CREATE TABLE IF NOT EXISTS {keyspace}.floor_entries (k blob PRIMARY KEY, value blob)",
    ):
        session.execute(ddl, timeout=60)
    insert_version = session.prepare(
        f"INSERT INTO {keyspace}.floor_versions (cell, ts, value) VALUES (?, ?, ?)"
    )
    insert_entry = session.prepare(f"INSERT INTO {keyspace}.floor_entries (k, value) VALUES (?, ?)")
    delete_range = session.prepare(
        f"DELETE FROM {keyspace}.floor_versions WHERE cell = ? AND ts >= ? AND ts <= ?"
    )
    delete_entry = session.prepare(f"DELETE FROM {keyspace}.floor_entries WHERE k = ?")
    cell = b"floor-cell"
    keys = [b"entry-%d" % i for i in range(versions)]
    progress(f"raw floor: writing {versions:,} versions and entries")
    for statement, params in (
        (insert_version, [(cell, ts, b"v") for ts in range(versions)]),
        (insert_entry, [(key, b"c") for key in keys]),
    ):
        execute_concurrent_with_args(
            session, statement, params, concurrency=CONCURRENCY, raise_on_first_error=True
        )
    progress("raw floor: the deletes")
    started = time.perf_counter()
    session.execute(delete_range, (cell, 0, versions - 2))
    execute_concurrent_with_args(
        session,
        delete_entry,
        [(key,) for key in keys],
        concurrency=CONCURRENCY,
        raise_on_first_error=True,
    )
    return time.perf_counter() - started
