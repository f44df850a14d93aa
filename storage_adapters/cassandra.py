"""The production backend: ``cassandra://HOST[:PORT][,HOST[:PORT]...]/KEYSPACE[?OPTIONS]``.

Physical layout (format 2; fixed, logical tables need no DDL at run time)::

    cell_versions ((tbl, cell), ts DESC)    -> value, deleted, commit_ts  -- cell_key(row, col)
    cells         ((tbl, shard), row, col)                      -- the index scans page
    system_rows   ((tbl, key))              -> value
    store_meta    (name)                    -> value   -- the layout format, the shard count

Versions. Each cell's versions are one partition of ``cell_versions``, newest first;
the partition key is ``cell_key``, a 32-byte BLAKE2b digest of the length-prefixed row
and column, so a key of any storable size makes the same small partition key. The
newest version below ``ts`` is the partition's first row below ``ts``: ``LIMIT 1``
for one cell, ``cell IN ? ... PER PARTITION LIMIT 1`` for up to ``_IN_LIMIT`` cells a
request. A read costs one row per cell returned, whatever the history (format 1's
``GROUP BY row, col`` read every version of each cell it touched: 60,000 versions of
a lakehouse head row cost 420 ms a read). Conflict checks read ``PER PARTITION LIMIT
n`` the same way. A partition grows with its cell's history only (100,000 versions of
~100 bytes: ~10 MB).

Scans. Cassandra hashes partition keys, yet scans come back in key order. Every cell
ever written has one row in ``cells``, in one of ``shards`` partitions of its table
(``shard = blake2b(row) mod shards``, 32 by default: ten million cells of ~50-byte keys
make index partitions of ~20 MB; pass ``shards=`` at creation for more). A scan pages
every shard's index from the cursor on (small pages first, doubling up to
``SCAN_PAGE_CELLS``), resolves each page's cells through ``cell_versions`` (newest
below the scan timestamp; cells without one are skipped) and merges the sorted
streams (a k-way heap merge); each shard reads and resolves its next page while the
current one is consumed. A scan of one row (``end_row == start_row + b"\\x00"``) reads
only that row's shard. The shard count and the format are fixed when the keyspace is
created and stored in ``store_meta``: every client must agree on them.

Writes. :meth:`CassandraStore.put_versions` writes each version into its cell's
partition and upserts the cell's index row. Index rows go as unlogged batches of one
index partition; versions (and deletes) as unlogged batches of at most 10 cell
partitions with the same first replica, which the driver sends to that replica (ten
writes a request: the Python driver's per-request cost, not the server, bounds a
client's write rate, and Cassandra warns about unlogged batches over 10 partitions);
it returns only when both landed, and the committer never reaches its commit point
after a failed ``put_versions`` (a store error in the write step aborts), so a
committed version always has its index row. The index row is never deleted.

Tombstones (issue 18 item 1). Clean-up deletes versions of aborted writers, and
Cassandra keeps each delete as a tombstone until ``gc_grace_seconds`` passed *and* a
compaction dropped it; a read crossing more than ``tombstone_failure_threshold``
(100,000) of them fails with ``READ_TOO_MANY_TOMBSTONES``. Format 1 kept every cell
of a shard in one partition and scanned it with ``GROUP BY``, crossing every tombstone
of the shard: 101,000 cleaned cells made every scan of the table fail. Now:

* a delete lands in its cell's own partition, so a read meets only tombstones of that
  cell, and only those between its snapshot and the newest live version below it (the
  versions of writers that aborted since the cell's last committed write);
* clean-up never touches the ``cells`` index, so a scan crosses no tombstone at all
  outside the cells it resolves: a cleaned cell costs it one index row and one
  tombstone, and a request resolves at most ``_IN_LIMIT`` cells, so it crosses that
  many such tombstones at most (the threshold counts per partition read);
* deletes are row deletes, never ranges: a range tombstone stamped above the doomed
  versions' write times would also cover a version written inside the range later by
  a client whose clock lags (see :meth:`CassandraStore.delete_versions`);
* ``cell_versions`` has ``gc_grace_seconds`` = ``VERSIONS_GC_GRACE_S`` (1 hour, not
  10 days). gc_grace exists so that a replica which missed a delete cannot bring the
  data back after the tombstone is gone. Here a version that comes back is one no
  reader uses: the transaction layer deletes only versions of writers settled ABORTED,
  whose ABORTED entry is permanent (``txn._cleaner``); a reader meeting one skips it
  and queues its removal again (``txn._snapshot``). Hints older than gc_grace are not
  replayed, and a late copy of the write (a resent request) comes within
  ``timeout_s``. Whoever adds sweeping of committed versions (GC, S8) must keep this
  true: a swept version must be one no reader above the safe point uses;
* compaction is ``LeveledCompactionStrategy`` with ``unchecked_tombstone_compaction``
  and ``tombstone_compaction_interval`` = 1 hour: reads dominate, a hot cell's versions
  arrive over days (with size-tiered compaction its partition would spread over many
  SSTables, each read at every ``LIMIT 1``; leveled keeps about one per level), and an
  SSTable whose droppable tombstones exceed 20% is compacted alone once it is an hour
  old, so tombstones go about an hour after gc_grace. ``cells`` is leveled too: scans
  read it in ranges, and a hot cell's index row is rewritten at every put (leveled
  keeps one copy per level); it is never deleted, so its gc_grace is the default.

The cost kept: a cell whose every version was cleaned keeps its index row, so scans
read it (and its one tombstone) for ever; where live cells are rare among dead ones a
scan is slow, never failing. Pruning dead runs of the index with range deletes needs
a sweeper that knows those cells are dead below a safe point: garbage collection's.

A keyspace of format 1 (a ``versions`` table, or ``format`` = 1 in ``store_meta``) is
refused with ``ValueError`` naming the problem, before anything is created in it;
nothing is converted. Clients of format 1 and 2 must not share a keyspace.

Limits (enforced before any I/O by the checks of :mod:`storage_adapters._base`, the
same on every backend): a clustering key holds at most 65,535 bytes; format 1 kept
``(row, col, ts)`` as one, hence row + column at most ``MAX_CELL_KEY_BYTES`` (65,527),
which the ``cells`` index ``(row, col)`` keeps with room to spare; the partition key
``(tbl, key)`` of ``system_rows`` bounds table name + key by ``MAX_SYSTEM_KEY_BYTES``
(65,529); a request holds at most 16 MiB, so values are at most ``MAX_VALUE_BYTES``
(15 MiB) and system values ``MAX_SYSTEM_VALUE_BYTES`` (7.5 MiB). A scan bound longer
than any storable key is cut to a prefix one byte longer than that, which selects the
same cells (``clamp_scan_bounds``), and page sizes to CQL's 32-bit ``LIMIT``.

Write timestamps. Writes carry the driver's client timestamps, so two writes of one
version are ordered by the clients' clocks, not by call order; the store contract
leaves that case out (callers write a version again only with the same value, and
never after deleting it). A delete is not left to the deleting client's clock: it
carries a timestamp above the version's write time, read first, so it always removes
the version (see :meth:`CassandraStore.delete_versions`).

Consistency: versions at ``consistency`` (``QUORUM`` by default, or ``LOCAL_QUORUM``
or ``ALL``); system rows through lightweight transactions (``IF NOT EXISTS``,
``IF value = ?``) at ``serial_consistency`` (``SERIAL`` or ``LOCAL_SERIAL``), and
read at that serial level, which makes them linearizable (rule S1).
``LOCAL_QUORUM``/``LOCAL_SERIAL`` are linearizable only while every client uses the
same data centre.

Errors. A conditional write whose outcome is unknown (``WriteTimeout`` of type CAS,
``WriteFailure``, ``CAS_WRITE_UNKNOWN``, a client-side timeout, a connection lost
mid-request, a server error, and ``Unavailable``: with Paxos v2 the coordinator raises it
before any proposal, but with Paxos v1, the server default, it can come from the commit
phase after a majority accepted) raises :class:`StoreTimeoutError`; the driver resends
a conditional write only after ``Unavailable``, which finds its own value if the first
attempt applied (rule S6). For other requests ``Unavailable``, overload and no reachable
host raise :class:`StoreUnavailableError`. A failed read of any kind raises
:class:`StoreUnavailableError`: a read writes nothing.

URL options (all optional):

``replication_factor=N``    keyspace replication when this URL creates it (default 1)
``consistency=QUORUM``      data reads and writes: QUORUM, LOCAL_QUORUM or ALL
``serial_consistency=SERIAL`` conditional writes and system reads: SERIAL or LOCAL_SERIAL
``shards=32``               partitions per logical table; fixed when the keyspace is created
``local_dc=NAME``           the data centre to prefer (default: the contact points')
``timeout_s=30``            client-side request timeout, above the server's own timeouts
``connect_timeout_s=10``    connection timeout

A user and password in the URL (``cassandra://user:password@host/ks``) log in with
Cassandra's password authenticator.

Modules: URL parsing and :func:`shard_of` live in :mod:`storage_adapters._cassandra_url`
(no driver needed), :func:`translate_error` and :class:`ConditionalWriteRetryPolicy` in
:mod:`storage_adapters._cassandra_errors`; both are re-exported here.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import time
import uuid
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.concurrent import execute_concurrent
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import BatchStatement, BatchType, tuple_factory

from storage_adapters._base import (
    MAX_PAGE_SIZE,
    MAX_TIMESTAMP,
    CasResult,
    Cell,
    KVStore,
    ScanEntry,
    Version,
    VersionStamp,
    VersionWrite,
    check_cells,
    check_deletes,
    check_limit,
    check_stamps,
    check_system_key,
    check_system_write,
    check_table,
    check_ts,
    check_writes,
    clamp_scan_bounds,
)
from storage_adapters._cassandra_errors import (
    ConditionalWriteRetryPolicy,
    never_sent,
    translate_error,
)
from storage_adapters._cassandra_url import (
    DEFAULT_PORT,
    DEFAULT_SHARDS,
    CassandraSettings,
    parse_cassandra_url,
    redact_url,
    shard_of,
)
from wire.errors import StoreUnavailableError

__all__ = [
    "CONCURRENCY",
    "DEFAULT_PORT",
    "DEFAULT_SHARDS",
    "CassandraSettings",
    "CassandraStore",
    "ConditionalWriteRetryPolicy",
    "parse_cassandra_url",
    "shard_of",
    "translate_error",
]

log = logging.getLogger(__name__)

#: A request the driver could not send (every connection's socket buffer full: a
#: write of megabytes going out) is sent again this many times, pausing 50 ms, 100 ms...
_BUSY_RETRIES = 5
_BUSY_PAUSE_S = 0.05

#: Requests in flight at once for one batched call: enough to hide a round trip,
#: few enough not to swamp a small cluster's native-transport queue.
CONCURRENCY = 64

# Writes to one partition go as one unlogged batch (one mutation, one request), kept
# under Cassandra's batch_size_warn_threshold (5 KiB) so that no batch logs a warning.
_BATCH_BYTES = 4096
_BATCH_ROWS = 100
# Writes to different partitions (versions of different cells, their deletes) share a
# batch only when one replica holds them all, and at most this many: Cassandra warns
# above unlogged_batch_across_partitions_warn_threshold (10). Ten rows a request cut
# the driver's per-request cost (the bottleneck of a Python client) about tenfold.
_CROSS_PARTITION_ROWS = 10
# Reads of many cells in one partition go as one query with an IN list of this size at most.
_IN_LIMIT = 100
# Requests that each touch many partitions (reads of up to _IN_LIMIT cells, batches of
# up to _CROSS_PARTITION_ROWS versions or deletes) in flight at once: 16 keep about
# 1,600 partition reads or 160 writes outstanding. CONCURRENCY of them timed out on a
# loaded two-core node (reads past 10 s, a delete batch past the 2 s write timeout).
_IN_CONCURRENCY = 16
# The largest write timestamp Cassandra takes (a signed 64-bit count of microseconds).
_MAX_WRITE_TIME = (1 << 63) - 1
# Table IDs derived from keyspace and table name: two clients creating the same table
# at once agree on its ID instead of racing to a schema disagreement.
_TABLE_ID_NAMESPACE = uuid.UUID("2f1f8c3e-6a43-5d7e-9a57-3c0fd6d4a1b2")
#: The physical layout: "1" was one ``versions`` table read with GROUP BY; "2" is this one.
_FORMAT_VERSION = "2"
_FORMAT_1_TABLE = "versions"


# --- the store ------------------------------------------------------------------------

#: How long a deleted version's tombstone must outlive the delete before compaction may
#: drop it. Short on purpose (the default is 10 days): every delete removes a version no
#: reader uses, so a version that comes back (a replica that missed the delete and was
#: not repaired in time) changes no read. See the module docstring.
VERSIONS_GC_GRACE_S = 3600
#: An SSTable of ``cell_versions`` older than this, whose droppable tombstones exceed
#: Cassandra's ``tombstone_threshold`` (20%), is compacted alone to drop them, without
#: waiting for its level to fill (the default interval is a day).
TOMBSTONE_COMPACTION_INTERVAL_S = 3600
#: Scans read a shard's index at most this many cells per request, and resolve them in
#: requests of ``_IN_LIMIT`` cells: with two pages in flight per shard, a 32-shard scan
#: keeps at most ~25,600 cell reads (256 requests) outstanding.
SCAN_PAGE_CELLS = 400


@dataclass(frozen=True, slots=True)
class _Statements:
    insert_version: Any
    index_cell: Any
    latest_one: Any  # cell = ?
    latest: Any  # cell IN ?
    version_ts_one: Any
    version_ts: Any
    versions_one: Any  # cell = ?: every version below ts, values and stamps
    versions: Any  # cell IN ?
    write_time: Any  # cell IN ?, ts = ?
    stamp: Any
    delete_version: Any
    index_from: Any  # (row, col) >= cursor
    index_after: Any  # (row, col) > cursor
    index_from_until: Any
    index_after_until: Any
    put_unless_exists: Any
    compare_and_set: Any
    get_system: Any
    delete_system: Any
    tables: Any


_DDL = {
    "cell_versions": f"""
        CREATE TABLE IF NOT EXISTS {{ks}}.cell_versions (
            tbl text, cell blob, ts bigint, value blob, deleted boolean, commit_ts bigint,
            PRIMARY KEY ((tbl, cell), ts)
        ) WITH CLUSTERING ORDER BY (ts DESC) AND ID = {{id}}
        AND gc_grace_seconds = {VERSIONS_GC_GRACE_S}
        AND compaction = {{{{'class': 'LeveledCompactionStrategy',
            'unchecked_tombstone_compaction': 'true',
            'tombstone_compaction_interval': '{TOMBSTONE_COMPACTION_INTERVAL_S}'}}}}""",
    "cells": """
        CREATE TABLE IF NOT EXISTS {ks}.cells (
            tbl text, shard int, row blob, col blob, PRIMARY KEY ((tbl, shard), row, col)
        ) WITH ID = {id} AND compaction = {{'class': 'LeveledCompactionStrategy'}}""",
    "system_rows": """
        CREATE TABLE IF NOT EXISTS {ks}.system_rows (
            tbl text, key blob, value blob, PRIMARY KEY ((tbl, key))
        ) WITH ID = {id}""",
    "store_meta": """
        CREATE TABLE IF NOT EXISTS {ks}.store_meta (
            name text PRIMARY KEY, value text
        ) WITH ID = {id}""",
}

_INDEX_SELECT = (
    "SELECT row, col FROM {ks}.cells "
    "WHERE tbl = ? AND shard = ? AND (row, col) {op} (?, ?) {until}LIMIT ?"
)


def cell_key(row: bytes, column: bytes) -> bytes:
    """A cell's partition key in ``cell_versions``: 32 bytes whatever the cell's size.

    BLAKE2b-256 of the row's length (4 bytes), the row and the column: the length keeps
    ``(b"ab", b"c")`` and ``(b"a", b"bc")`` apart. A collision would need 2**128 cells.
    """
    return hashlib.blake2b(
        len(row).to_bytes(4, "big") + row + column, digest_size=32, person=b"percolake.cell"
    ).digest()


def _format_error(keyspace: str, found: str) -> ValueError:
    if found == "1":
        what = (
            "percolake's format 1 Cassandra layout (one table 'versions' read with GROUP BY, "
            "which crosses every older version and every clean-up tombstone: issue 18)"
        )
    else:
        what = f"percolake Cassandra layout format {found!r}"
    return ValueError(
        f"keyspace {keyspace!r} holds {what}; this percolake reads format {_FORMAT_VERSION} "
        "only (tables 'cell_versions' and 'cells') and converts nothing. Open a new "
        "keyspace, or copy the cells over (scan with the old version, put_versions with "
        "this one)."
    )


class CassandraStore(KVStore):
    """:class:`KVStore` on Apache Cassandra (see the module docstring for the layout)."""

    concurrent_requests = True

    def __init__(self, url: str) -> None:
        self.settings = parse_cassandra_url(url)
        self._url = redact_url(url)
        self._closed = False
        self._cluster: Any = None
        self._session: Any = self._connect()
        try:
            self._ensure_schema()
            self._stmts = self._prepare()
            self.shards = self._agree_on_shards()
        except BaseException:
            self.close()
            raise

    @classmethod
    def _with_session(cls, url: str, session: Any, shards: int = DEFAULT_SHARDS) -> CassandraStore:
        """A store over an existing (possibly fake) session: no connect, no DDL. For tests."""
        store = cls.__new__(cls)
        store.settings = parse_cassandra_url(url)
        store._url = redact_url(url)
        store._closed = False
        store._cluster = None
        store._session = session
        store._stmts = store._prepare()
        store.shards = shards
        return store

    # --- setup ----------------------------------------------------------------------

    def _connect(self) -> Any:
        s = self.settings
        data_level = getattr(ConsistencyLevel, s.consistency)
        serial_level = getattr(ConsistencyLevel, s.serial_consistency)

        def balancing() -> Any:
            return TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=s.local_dc))

        profiles = {
            EXEC_PROFILE_DEFAULT: ExecutionProfile(
                load_balancing_policy=balancing(),
                consistency_level=data_level,
                request_timeout=s.timeout_s,
                row_factory=tuple_factory,
            ),
            # The commit phase of a conditional write runs at the data level, its
            # Paxos rounds at the serial level; see ConditionalWriteRetryPolicy.
            "lwt": ExecutionProfile(
                load_balancing_policy=balancing(),
                consistency_level=data_level,
                serial_consistency_level=serial_level,
                request_timeout=s.timeout_s,
                row_factory=tuple_factory,
                retry_policy=ConditionalWriteRetryPolicy(),
            ),
            "serial_read": ExecutionProfile(
                load_balancing_policy=balancing(),
                consistency_level=serial_level,
                request_timeout=s.timeout_s,
                row_factory=tuple_factory,
            ),
        }
        auth = (
            PlainTextAuthProvider(username=s.username, password=s.password)
            if s.username is not None
            else None
        )
        self._cluster = Cluster(
            list(s.hosts),
            port=s.port,
            protocol_version=5,
            execution_profiles=profiles,
            auth_provider=auth,
            connect_timeout=s.connect_timeout_s,
            control_connection_timeout=s.connect_timeout_s,
        )
        try:
            return self._cluster.connect()
        except Exception as exc:
            self._cluster.shutdown()
            raise translate_error(exc, conditional_write=False, write=False) from exc

    def _ensure_schema(self) -> None:
        s = self.settings
        ks = _quote(s.keyspace)
        metadata = self._cluster.metadata.keyspaces.get(s.keyspace)
        if metadata is None:
            log.info("creating keyspace %s (replication factor %d)", ks, s.replication_factor)
            self._ddl(
                f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = "
                "{'class': 'NetworkTopologyStrategy', "
                f"'replication_factor': {s.replication_factor}}}"
            )
            metadata = self._cluster.metadata.keyspaces.get(s.keyspace)
        existing = set(metadata.tables) if metadata is not None else set()
        if _FORMAT_1_TABLE in existing:  # checked before anything is created in it
            raise _format_error(s.keyspace, "1")
        for table, ddl in _DDL.items():
            if table not in existing:
                table_id = uuid.uuid5(_TABLE_ID_NAMESPACE, f"{s.keyspace}.{table}")
                self._ddl(ddl.format(ks=ks, id=table_id))
        versions = metadata.tables.get("cell_versions") if metadata is not None else None
        if versions is not None and "commit_ts" not in versions.columns:
            # A format-2 keyspace from before commit stamps (rule S9): add the column.
            log.info("adding commit_ts to %s.cell_versions", ks)
            self._ddl(f"ALTER TABLE {ks}.cell_versions ADD commit_ts bigint")

    def _ddl(self, statement: str) -> None:
        """Run a schema change and wait until every node has it.

        A conditional write to a table some replica does not know yet fails with
        INCOMPATIBLE_SCHEMA, so the first use of a new keyspace must wait here.
        """
        try:
            result = self._session.execute(statement, timeout=max(self.settings.timeout_s, 60.0))
            agreed = result.response_future.is_schema_agreed
            if not agreed:
                agreed = self._cluster.control_connection.wait_for_schema_agreement(wait_time=60)
        except Exception as exc:
            raise translate_error(exc, conditional_write=False, write=True) from exc
        if not agreed:
            raise StoreUnavailableError(
                "Cassandra nodes did not agree on the schema within 60 s after: "
                + " ".join(statement.split())
            )

    def _prepare(self) -> _Statements:
        ks = _quote(self.settings.keyspace)

        def prepare(cql: str, *, idempotent: bool = True) -> Any:
            statement = self._session.prepare(cql.format(ks=ks))
            statement.is_idempotent = idempotent
            return statement

        versions = (
            "SELECT cell, ts, value, deleted, commit_ts FROM {ks}.cell_versions WHERE tbl = ? AND "
        )
        stamps = "SELECT cell, ts FROM {ks}.cell_versions WHERE tbl = ? AND "
        until = "AND (row) < (?) "
        return _Statements(
            insert_version=prepare(
                "INSERT INTO {ks}.cell_versions (tbl, cell, ts, value, deleted) "
                "VALUES (?, ?, ?, ?, ?)"
            ),
            index_cell=prepare("INSERT INTO {ks}.cells (tbl, shard, row, col) VALUES (?, ?, ?, ?)"),
            # The newest version below ts: the first row of the partition (ts DESC).
            latest_one=prepare(versions + "cell = ? AND ts < ? LIMIT 1"),
            latest=prepare(versions + "cell IN ? AND ts < ? PER PARTITION LIMIT 1"),
            # An inclusive upper bound: the open bound above MAX_TIMESTAMP (2**63) does
            # not fit a bigint, its inclusive form (MAX_TIMESTAMP) does.
            version_ts_one=prepare(stamps + "cell = ? AND ts > ? AND ts <= ? LIMIT ?"),
            version_ts=prepare(stamps + "cell IN ? AND ts > ? AND ts <= ? PER PARTITION LIMIT ?"),
            versions_one=prepare(versions + "cell = ? AND ts < ? LIMIT ?"),
            versions=prepare(versions + "cell IN ? AND ts < ? PER PARTITION LIMIT ?"),
            # A stamp carries its version's write time: a delete of the version (above
            # that time) removes the stamp too, and a stamp never brings a version back.
            stamp=prepare(
                "UPDATE {ks}.cell_versions USING TIMESTAMP ? SET commit_ts = ? "
                "WHERE tbl = ? AND cell = ? AND ts = ?"
            ),
            write_time=prepare(
                "SELECT cell, WRITETIME(deleted) FROM {ks}.cell_versions "
                "WHERE tbl = ? AND cell IN ? AND ts = ?"
            ),
            delete_version=prepare(
                "DELETE FROM {ks}.cell_versions USING TIMESTAMP ? "
                "WHERE tbl = ? AND cell = ? AND ts = ?"
            ),
            index_from=prepare(_INDEX_SELECT.format(ks="{ks}", op=">=", until="")),
            index_after=prepare(_INDEX_SELECT.format(ks="{ks}", op=">", until="")),
            index_from_until=prepare(_INDEX_SELECT.format(ks="{ks}", op=">=", until=until)),
            index_after_until=prepare(_INDEX_SELECT.format(ks="{ks}", op=">", until=until)),
            put_unless_exists=prepare(
                "INSERT INTO {ks}.system_rows (tbl, key, value) VALUES (?, ?, ?) IF NOT EXISTS",
                idempotent=False,
            ),
            compare_and_set=prepare(
                "UPDATE {ks}.system_rows SET value = ? WHERE tbl = ? AND key = ? IF value = ?",
                idempotent=False,
            ),
            get_system=prepare("SELECT value FROM {ks}.system_rows WHERE tbl = ? AND key = ?"),
            delete_system=prepare(
                "DELETE FROM {ks}.system_rows WHERE tbl = ? AND key = ? IF value = ?",
                idempotent=False,
            ),
            tables=prepare("SELECT DISTINCT tbl, shard FROM {ks}.cells"),
        )

    def _agree_on_shards(self) -> int:
        """The keyspace's shard count: the first opener's choice, stored with an LWT."""
        ks = _quote(self.settings.keyspace)
        insert = self._session.prepare(
            f"INSERT INTO {ks}.store_meta (name, value) VALUES (?, ?) IF NOT EXISTS"
        )
        applied, stored = self._execute_lwt(insert, ("format", _FORMAT_VERSION))
        if not applied and stored != _FORMAT_VERSION:
            raise _format_error(self.settings.keyspace, str(stored))
        applied, stored = self._execute_lwt(insert, ("shards", str(self.settings.shards)))
        shards = self.settings.shards if applied else int(stored or DEFAULT_SHARDS)
        if self.settings.shards_given and shards != self.settings.shards:
            raise ValueError(
                f"keyspace {self.settings.keyspace!r} was created with shards={shards}; "
                f"the URL asks for shards={self.settings.shards}"
            )
        return shards

    # --- versioned cells ------------------------------------------------------------

    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        """Write each version into its cell's partition and the cell into the index.

        Both land before this returns, or it raises: the committer never reaches its
        commit point after a failed ``put_versions`` (it aborts), so a committed version
        always has its index row and scans find it.
        """
        check_table(table)
        writes = check_writes(versions)
        self._check_open()
        # The last write of a version wins, as in the reference backend; within one
        # batch Cassandra would instead keep the greater value.
        latest = {(v.row, v.column, v.ts): v.value for v in writes}
        version_items: list[tuple[Hashable, tuple[Any, ...], int]] = []
        index_items: dict[tuple[bytes, bytes], tuple[Hashable, tuple[Any, ...], int]] = {}
        for (row, column, ts), value in latest.items():
            key = cell_key(row, column)
            version_items.append(
                (
                    self._replica(table, key),
                    (table, key, ts, value or b"", value is None),
                    len(value or b"") + 80,
                )
            )
            if (row, column) not in index_items:
                shard = shard_of(row, self.shards)
                index_items[row, column] = (
                    shard,
                    (table, shard, row, column),
                    len(row) + len(column) + 24,
                )
        queries = _batched(self._stmts.insert_version, version_items, _CROSS_PARTITION_ROWS)
        queries += _batched(self._stmts.index_cell, list(index_items.values()))
        self._execute_all(queries, write=True, concurrency=_IN_CONCURRENCY)

    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        self._check_open()
        keys = {cell_key(c.row, c.column): c for c in wanted}
        queries = self._per_cell(
            self._stmts.latest_one, self._stmts.latest, table, list(keys), (below_ts,)
        )
        out: dict[Cell, Version] = {}
        for rows in self._execute_all(queries, write=False, concurrency=_IN_CONCURRENCY):
            for key, ts, value, deleted, commit_ts in rows:
                out[keys[_bytes(key)]] = Version(ts, _value(value, deleted), commit_ts)
        return out

    def _scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        # KVStore.scan capped page_size at MAX_PAGE_SIZE, CQL's 32-bit LIMIT.
        self._check_open()
        # A bound longer than any stored key selects what its prefix selects (see
        # clamp_scan_bounds): send the prefix, once per shard and page, not the bound.
        start_row, start_column, end_row = clamp_scan_bounds(start_row, start_column, end_row)
        return self._scan_shards(table, start_row, end_row, below_ts, start_column, page_size)

    def _scan_shards(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        if end_row is not None and end_row <= start_row:
            return
        if end_row == start_row + b"\x00":  # exactly one row: it lives in one shard
            shards: Sequence[int] = [shard_of(start_row, self.shards)]
        else:
            shards = range(self.shards)
        max_limit = min(page_size, SCAN_PAGE_CELLS)
        # Rows spread evenly over shards, so a first page of 2 * page_size / shards per
        # shard usually fills the caller's first page without reading far ahead.
        first_limit = min(max_limit, max(16, 2 * -(-page_size // len(shards))))
        streams = [
            _ShardScan(
                self,
                table,
                shard,
                start_row,
                start_column,
                end_row,
                below_ts,
                first_limit,
                max_limit,
            )
            for shard in shards
        ]
        for stream in streams:
            stream.request()
        yield from heapq.merge(*(s.entries() for s in streams))

    def get_version_timestamps(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        above_ts: int = -1,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[int]]:
        check_table(table)
        wanted = check_cells(cells)
        for name, bound in (("above_ts", above_ts), ("below_ts", below_ts)):
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise TypeError(f"{name} must be int, got {type(bound).__name__}")
        limit = check_limit(limit)
        self._check_open()
        # Stored timestamps lie in [0, MAX_TIMESTAMP], so clamping the bounds to that
        # range changes no match, and a bigint carries them. The upper bound goes as
        # ``ts <= below_ts - 1``: clamping the open ``ts < below_ts`` itself would turn
        # below_ts=2**63 into ``ts < MAX_TIMESTAMP`` and lose a version at MAX_TIMESTAMP.
        above = min(max(above_ts, -1), MAX_TIMESTAMP)
        last = min(max(below_ts - 1, -1), MAX_TIMESTAMP)
        if last <= above:
            return {}
        keys = {cell_key(c.row, c.column): c for c in wanted}
        per_cell = MAX_PAGE_SIZE if limit is None else min(limit, MAX_PAGE_SIZE)
        queries = self._per_cell(
            self._stmts.version_ts_one,
            self._stmts.version_ts,
            table,
            list(keys),
            (above, last, per_cell),
        )
        out: dict[Cell, list[int]] = {}
        for rows in self._execute_all(queries, write=False, concurrency=_IN_CONCURRENCY):
            for key, ts in rows:
                out.setdefault(keys[_bytes(key)], []).append(ts)
        for tss in out.values():
            tss.sort(reverse=True)  # one partition's rows come newest first; this is cheap
        return out

    def get_versions(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[Version]]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        limit = check_limit(limit)
        self._check_open()
        keys = {cell_key(c.row, c.column): c for c in wanted}
        per_cell = MAX_PAGE_SIZE if limit is None else min(limit, MAX_PAGE_SIZE)
        queries = self._per_cell(
            self._stmts.versions_one, self._stmts.versions, table, list(keys), (below_ts, per_cell)
        )
        out: dict[Cell, list[Version]] = {}
        for rows in self._execute_all(queries, write=False, concurrency=_IN_CONCURRENCY):
            for key, ts, value, deleted, commit_ts in rows:
                out.setdefault(keys[_bytes(key)], []).append(
                    Version(ts, _value(value, deleted), commit_ts)
                )
        for found in out.values():
            found.sort(key=lambda v: v.ts, reverse=True)
        return out

    def stamp_versions(self, table: str, stamps: Sequence[VersionStamp]) -> None:
        """Write each stamp at its version's write time, read first.

        At the version's own write time a stamp is shadowed by any delete of the version
        (deletes go above the write time, :meth:`delete_versions`), whether it lands
        before or after the stamp: a stamp never makes a deleted version reappear (as
        a row holding only ``commit_ts``). A version not found is not stamped.
        """
        check_table(table)
        wanted = {(s.row, s.column, s.ts): s.commit_ts for s in check_stamps(stamps)}
        self._check_open()
        if not wanted:
            return
        written = self._write_times(table, list(wanted))
        updates: list[tuple[Hashable, tuple[Any, ...], int]] = []
        for (row, column, ts), commit_ts in wanted.items():
            key = cell_key(row, column)
            write_time = written.get((key, ts))
            if write_time is not None:
                updates.append(
                    (self._replica(table, key), (write_time, commit_ts, table, key, ts), 60)
                )
        self._execute_all(
            _batched(self._stmts.stamp, updates, _CROSS_PARTITION_ROWS),
            write=True,
            concurrency=_IN_CONCURRENCY,
        )

    def tables(self) -> list[str]:
        self._check_open()
        rows = self._execute_all([(self._stmts.tables, ())], write=False)[0]
        return sorted({tbl for tbl, _ in rows})

    def _write_times(
        self, table: str, versions: Sequence[tuple[bytes, bytes, int]]
    ) -> dict[tuple[bytes, int], int]:
        """The write time of each existing version, by (cell key, ts); ``_IN_LIMIT`` cells
        of one timestamp a request."""
        by_ts: dict[int, list[bytes]] = {}
        for row, column, ts in versions:
            by_ts.setdefault(ts, []).append(cell_key(row, column))
        reads = [
            (self._stmts.write_time, (table, keys[i : i + _IN_LIMIT], ts))
            for ts, keys in by_ts.items()
            for i in range(0, len(keys), _IN_LIMIT)
        ]
        written: dict[tuple[bytes, int], int] = {}
        found = self._execute_all(reads, write=False, concurrency=_IN_CONCURRENCY)
        for (_, (_, _, ts)), rows in zip(reads, found, strict=True):
            for key, write_time in rows:
                if write_time is not None:
                    written[_bytes(key), ts] = write_time
        return written

    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        """Delete each version above its write time, not at this client's clock.

        Cassandra keeps, of a write and a delete of the same version, the one with the
        greater timestamp (the delete on a tie), and timestamps come from the clients'
        clocks. A cleaner whose clock lags the writer's would otherwise leave the
        version in place. So each version's write time is read first (at the data
        consistency level, which sees every write that completed or was read) and the
        delete carries ``max(this client's clock, write time + 1)``: it beats that
        write and any late copy of it (a resent request, a replayed hint, for
        ``VERSIONS_GC_GRACE_S``), and a write this client makes afterwards still beats
        the delete, as on the other backends. The write times of one timestamp's
        versions are read together (a cleaner deletes one aborted writer's versions:
        one timestamp, many cells), ``_IN_LIMIT`` cells a request.

        Each delete is one row tombstone in the version's own cell partition, never a
        range: a range tombstone stamped above the doomed versions' write times would
        also cover a version another writer puts inside the range later with a lagging
        clock (a committed one, perhaps), and nothing orders those clocks.
        """
        check_table(table)
        doomed = list(dict.fromkeys(check_deletes(versions)))
        self._check_open()
        if not doomed:
            return
        written = self._write_times(table, [(cell.row, cell.column, ts) for cell, ts in doomed])
        now = self._session.cluster.timestamp_generator()
        deletes: list[tuple[Hashable, tuple[Any, ...], int]] = []
        for cell, ts in doomed:
            key = cell_key(cell.row, cell.column)
            write_time = written.get((key, ts))
            at = now if write_time is None else min(max(now, write_time + 1), _MAX_WRITE_TIME)
            deletes.append((self._replica(table, key), (at, table, key, ts), 60))
        self._execute_all(
            _batched(self._stmts.delete_version, deletes, _CROSS_PARTITION_ROWS),
            write=True,
            concurrency=_IN_CONCURRENCY,
        )

    def _replica(self, table: str, key: bytes) -> Hashable:
        """The first replica of a cell's partition (``None`` when the driver has no
        token map): writes to partitions of one replica may share a batch, which the
        driver sends to that replica (it routes a batch by its first statement)."""
        token_map = None if self._cluster is None else self._cluster.metadata.token_map
        if token_map is None:
            return None
        routing_key = _component(table.encode()) + _component(key)
        token = token_map.token_class.from_key(routing_key)
        replicas = token_map.get_replicas(self.settings.keyspace, token)
        return replicas[0] if replicas else None

    def _per_cell(
        self, one: Any, many: Any, table: str, keys: list[bytes], rest: tuple[Any, ...]
    ) -> list[tuple[Any, tuple[Any, ...] | None]]:
        """Reads of cell partitions: ``_IN_LIMIT`` cells a request (``cell IN ?``), and a
        lone cell by ``cell = ?``, which the driver routes to a replica (token aware)."""
        queries: list[tuple[Any, tuple[Any, ...] | None]] = []
        for i in range(0, len(keys), _IN_LIMIT):
            chunk = keys[i : i + _IN_LIMIT]
            if len(chunk) == 1:
                queries.append((one, (table, chunk[0], *rest)))
            else:
                queries.append((many, (table, chunk, *rest)))
        return queries

    # --- system rows ----------------------------------------------------------------

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        check_system_write(table, key, value)
        self._check_open()
        applied, existing = self._execute_lwt(self._stmts.put_unless_exists, (table, key, value))
        if applied:
            return CasResult(True, value)
        return CasResult(False, None if existing is None else _bytes(existing))

    def compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> CasResult:
        check_system_write(table, key, value, expected=expected)
        if expected is None:
            return self.put_unless_exists(table, key, value)
        self._check_open()
        applied, current = self._execute_lwt(
            self._stmts.compare_and_set, (value, table, key, expected)
        )
        if applied:
            return CasResult(True, value)
        return CasResult(False, None if current is None else _bytes(current))

    def get_system(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        check_table(table)
        wanted = [check_system_key(table, k) for k in keys]
        self._check_open()
        wanted = list(dict.fromkeys(wanted))
        results = self._execute_many(
            self._stmts.get_system,
            [(table, k) for k in wanted],
            write=False,
            profile="serial_read",
        )
        return {k: _bytes(rows[0][0]) for k, rows in zip(wanted, results, strict=True) if rows}

    def delete_system(self, table: str, key: bytes, expected: bytes) -> CasResult:
        check_system_write(table, key, expected)
        self._check_open()
        applied, current = self._execute_lwt(self._stmts.delete_system, (table, key, expected))
        if applied:
            return CasResult(True, None)
        return CasResult(False, None if current is None else _bytes(current))

    # --- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._cluster is not None:
            self._cluster.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("store is closed")

    # --- execution ------------------------------------------------------------------

    def _execute_many(
        self,
        statement: Any,
        params: Sequence[tuple[Any, ...]],
        *,
        write: bool,
        profile: object = None,
    ) -> list[list[tuple[Any, ...]]]:
        """Run one prepared statement per parameter tuple, ``CONCURRENCY`` at a time."""
        return self._execute_all([(statement, p) for p in params], write=write, profile=profile)

    def _execute_all(
        self,
        queries: Sequence[tuple[Any, tuple[Any, ...] | None]],
        *,
        write: bool,
        profile: object = None,
        concurrency: int = CONCURRENCY,
    ) -> list[list[tuple[Any, ...]]]:
        """Run ``(statement, params)`` pairs, ``concurrency`` at a time; rows of each.

        Reads, and writes of versions (idempotent by the store contract), so a run
        that failed because the driver could not send a request (:func:`never_sent`)
        is run again after a short pause, ``_BUSY_RETRIES`` times at most.
        """
        if not queries:
            return []
        profile = profile or EXEC_PROFILE_DEFAULT
        for attempt in range(_BUSY_RETRIES + 1):
            try:
                if len(queries) == 1:
                    statement, params = queries[0]
                    rows = self._session.execute(statement, params, execution_profile=profile)
                    return [list(rows or ())]
                results = execute_concurrent(
                    self._session,
                    queries,
                    concurrency=concurrency,
                    raise_on_first_error=True,
                    execution_profile=profile,
                )
                return [list(result or ()) for _, result in results]
            except Exception as exc:
                if never_sent(exc) and attempt < _BUSY_RETRIES:
                    log.debug("Cassandra connection busy; sending again: %s", exc)
                    time.sleep(_BUSY_PAUSE_S * 2**attempt)
                    continue
                raise translate_error(exc, conditional_write=False, write=write) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _execute_lwt(self, statement: Any, params: tuple[Any, ...]) -> tuple[bool, Any]:
        """Run one conditional write: ``(applied, value found when not applied)``."""
        try:
            result = self._session.execute(statement, params, execution_profile="lwt")
        except Exception as exc:
            raise translate_error(exc, conditional_write=True, write=True) from exc
        names = list(result.column_names or ())
        rows = list(result)
        if not rows:
            raise RuntimeError("a conditional write returned no [applied] row")
        row = rows[0]
        applied = bool(row[0])
        if applied or "value" not in names:
            return applied, None
        return applied, row[names.index("value")]


class _ShardScan:
    """One shard's part of a scan: index pages resolved to each cell's newest version.

    A page of the shard's ``cells`` index (sorted by row, column) is resolved through
    ``cell_versions`` (``PER PARTITION LIMIT 1`` below the scan timestamp), and cells
    without such a version are skipped. While a page is consumed the next one is
    already read and being resolved: two pages in flight per shard.
    """

    def __init__(
        self,
        store: CassandraStore,
        table: str,
        shard: int,
        start_row: bytes,
        start_column: bytes,
        end_row: bytes | None,
        below_ts: int,
        first_limit: int,
        max_limit: int,
    ) -> None:
        self._store = store
        self._table = table
        self._shard = shard
        self._cursor = (start_row, start_column)
        self._inclusive = True
        self._end_row = end_row
        self._below_ts = below_ts
        self._limit = first_limit
        self._max_limit = max_limit
        self._pending: _Request | None = None  # the index page being read, if any

    def request(self) -> None:
        """Start reading the next index page, asynchronously."""
        stmts = self._store._stmts
        row, column = self._cursor
        params: list[Any] = [self._table, self._shard, row, column]
        if self._end_row is None:
            statement = stmts.index_from if self._inclusive else stmts.index_after
        else:
            statement = stmts.index_from_until if self._inclusive else stmts.index_after_until
            params.append(self._end_row)
        params.append(self._limit)
        self._pending = self._send(statement, params)

    def entries(self) -> Iterator[ScanEntry]:
        page = self._next_page()
        while page is not None:
            cells, resolving = page
            page = self._next_page()  # read and resolve the next page meanwhile
            found: dict[bytes, tuple[int, bytes | None, int | None]] = {}
            for future in resolving:
                for key, ts, value, deleted, commit_ts in self._result(future):
                    found[_bytes(key)] = (ts, _value(value, deleted), commit_ts)
            for row, column, key in cells:
                version = found.get(key)
                if version is not None:
                    yield ScanEntry(row, column, *version)

    def _next_page(self) -> tuple[list[tuple[bytes, bytes, bytes]], list[_Request]] | None:
        """The next index page and the requests resolving it; ``None`` at the end."""
        if self._pending is None:
            return None
        rows = self._result(self._pending)
        self._pending = None
        if len(rows) == self._limit:  # maybe more: ask now, read while it travels
            last = rows[-1]
            self._cursor, self._inclusive = (_bytes(last[0]), _bytes(last[1])), False
            self._limit = min(self._max_limit, self._limit * 2)
            self.request()
        cells = [(_bytes(r), _bytes(c), cell_key(_bytes(r), _bytes(c))) for r, c in rows]
        keys = [key for _, _, key in cells]
        store = self._store
        queries = store._per_cell(
            store._stmts.latest_one, store._stmts.latest, self._table, keys, (self._below_ts,)
        )
        return cells, [self._send(statement, params) for statement, params in queries]

    def _send(self, statement: Any, params: Any) -> _Request:
        return _Request(self._store._session, statement, params)

    @staticmethod
    def _result(request: _Request) -> list[Any]:
        return request.rows()


class _Request:
    """One read sent asynchronously; ``rows()`` waits for its rows.

    A read the driver could not send (:func:`never_sent`: every socket buffer full,
    which a scan's many requests with long bounds can cause) is sent again,
    ``_BUSY_RETRIES`` times at most, as in ``CassandraStore._execute_all``.
    """

    def __init__(self, session: Any, statement: Any, params: Any) -> None:
        self._session = session
        self._statement = statement
        self._params = params
        self._future = self._send()

    def _send(self) -> Any:
        try:
            return self._session.execute_async(self._statement, self._params)
        except Exception as exc:
            raise translate_error(exc, conditional_write=False, write=False) from exc

    def rows(self) -> list[Any]:
        for attempt in range(_BUSY_RETRIES + 1):
            try:
                return list(self._future.result())
            except Exception as exc:
                if never_sent(exc) and attempt < _BUSY_RETRIES:
                    log.debug("Cassandra connection busy; sending again: %s", exc)
                    time.sleep(_BUSY_PAUSE_S * 2**attempt)
                    self._future = self._send()
                    continue
                raise translate_error(exc, conditional_write=False, write=False) from exc
        raise AssertionError("unreachable")  # pragma: no cover


def _batched(
    statement: Any,
    items: Sequence[tuple[Hashable, tuple[Any, ...], int]],
    max_rows: int = _BATCH_ROWS,
) -> list[tuple[Any, tuple[Any, ...] | None]]:
    """``(group, params, approximate bytes)`` writes as unlogged batches of one group
    each (a partition, or the partitions of one replica), ``max_rows`` at most.

    Only writes that add up to ``_BATCH_BYTES`` share a batch; a larger write goes alone.
    So no request is bigger than the largest single write, which the value and key
    limits keep under Cassandra's 16 MiB message limit.
    """
    by_partition: dict[Hashable, list[tuple[tuple[Any, ...], int]]] = {}
    for partition, params, size in items:
        by_partition.setdefault(partition, []).append((params, size))
    out: list[tuple[Any, tuple[Any, ...] | None]] = []

    def flush(chunk: list[tuple[Any, ...]]) -> None:
        if len(chunk) == 1:
            out.append((statement, chunk[0]))
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.is_idempotent = True
        for params in chunk:
            batch.add(statement, params)
        out.append((batch, None))

    for entries in by_partition.values():
        chunk: list[tuple[Any, ...]] = []
        chunk_bytes = 0
        for params, size in entries:
            if chunk and (chunk_bytes + size > _BATCH_BYTES or len(chunk) >= max_rows):
                flush(chunk)
                chunk, chunk_bytes = [], 0
            chunk.append(params)
            chunk_bytes += size
        if chunk:
            flush(chunk)
    return out


# --- helpers --------------------------------------------------------------------------


def _component(part: bytes) -> bytes:
    """One component of a composite partition key as Cassandra hashes it."""
    return len(part).to_bytes(2, "big") + part + b"\x00"


def _value(value: bytes | None, deleted: bool | None) -> bytes | None:
    if deleted:
        return None
    return b"" if value is None else _bytes(value)


def _bytes(value: Any) -> bytes:
    return bytes(value)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
