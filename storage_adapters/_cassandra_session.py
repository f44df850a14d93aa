"""The Cassandra store's connection, schema, prepared statements and request running.

The layout these serve, and why, is in :mod:`storage_adapters.cassandra`'s docstring;
the store's reads are in :mod:`storage_adapters._cassandra_reads`, its writes, deletes
and conditional writes in :mod:`storage_adapters.cassandra`.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Self

from cassandra import ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import tuple_factory

from storage_adapters._base import KVStore
from storage_adapters._cassandra_errors import (
    ConditionalWriteRetryPolicy,
    never_sent,
    translate_error,
)
from storage_adapters._cassandra_url import DEFAULT_SHARDS, parse_cassandra_url, redact_url
from wire.errors import StoreTimeoutError, StoreUnavailableError

log = logging.getLogger(__name__)

#: A request the driver could not send (every connection's socket buffer full: a
#: write of megabytes going out) is sent again this many times, pausing 50 ms, 100 ms...
_BUSY_RETRIES = 5
_BUSY_PAUSE_S = 0.05

#: Requests in flight at once for one batched call: enough to hide a round trip,
#: few enough not to swamp a small cluster's native-transport queue.
CONCURRENCY = 64

# Reads of many cells in one partition go as one query with an IN list of this size at most.
_IN_LIMIT = 100
# A point read of few cells is spread over about this many requests, of at least
# _IN_MIN cells each (CassandraConnection._per_cell): a coordinator reads an IN list's
# partitions one after another, separate requests in parallel.
_IN_SPREAD = 8
_IN_MIN = 8
# Requests that each touch many partitions (reads of up to _IN_LIMIT cells, batches of
# up to _CROSS_PARTITION_ROWS versions or deletes) in flight at once: 16 keep about
# 1,600 partition reads or 160 writes outstanding. CONCURRENCY of them timed out on a
# loaded two-core node (reads past 10 s, a delete batch past the 2 s write timeout).
_IN_CONCURRENCY = 16
# Table IDs derived from keyspace and table name: two clients creating the same table
# at once agree on its ID instead of racing to a schema disagreement.
_TABLE_ID_NAMESPACE = uuid.UUID("2f1f8c3e-6a43-5d7e-9a57-3c0fd6d4a1b2")
#: The physical layout: "1" was one ``versions`` table read with GROUP BY; "2" is this one.
_FORMAT_VERSION = "2"
_FORMAT_1_TABLE = "versions"

#: How long a deleted version's tombstone must outlive the delete before compaction may
#: drop it. Short on purpose (the default is 10 days): every delete removes a version no
#: reader uses, so a version that comes back (a replica that missed the delete and was
#: not repaired in time) changes no read. See the module docstring.
VERSIONS_GC_GRACE_S = 3600
#: An SSTable of ``cell_versions`` older than this, whose droppable tombstones exceed
#: Cassandra's ``tombstone_threshold`` (20%), is compacted alone to drop them, without
#: waiting for its level to fill (the default interval is a day).
TOMBSTONE_COMPACTION_INTERVAL_S = 3600
#: The ``cells`` index's options. A prune's range tombstones may go at the first
#: compaction after their flush: an index row that comes back (a replica that missed the
#: prune) only costs a scan one dead cell until the next prune, and purging a tombstone
#: never hides a row (storage.md, "Pruning the index"). Kept an hour, the tombstones
#: cost every scan one partition read per shard for that hour (2.3x the scan of a fresh
#: table of 2 live cells, against 1.2x once gone). A quiet table's memtable is flushed
#: each minute, so the tombstones reach a compaction within minutes.
INDEX_GC_GRACE_S = 0
INDEX_TOMBSTONE_COMPACTION_INTERVAL_S = 60
INDEX_MEMTABLE_FLUSH_PERIOD_MS = 60_000


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
    range_write_time: Any  # the newest write time in cell = ?, low <= ts <= high
    delete_range: Any  # one range tombstone: cell = ?, low <= ts <= high
    prune_run: Any  # one range tombstone over a run of the index
    index_from: Any  # (row, col) >= cursor
    index_after: Any  # (row, col) > cursor
    index_from_until: Any
    index_after_until: Any
    put_unless_exists: Any
    compare_and_set: Any
    get_system: Any
    delete_system: Any
    system_written_one: Any  # key = ?: value and write time, at the data level
    system_written: Any  # key IN ?
    delete_system_at: Any  # a tombstone at a given write time
    tables: Any


_INDEX_OPTIONS = (
    f"gc_grace_seconds = {INDEX_GC_GRACE_S} "
    f"AND memtable_flush_period_in_ms = {INDEX_MEMTABLE_FLUSH_PERIOD_MS} "
    "AND compaction = {'class': 'LeveledCompactionStrategy', "
    "'unchecked_tombstone_compaction': 'true', "
    f"'tombstone_compaction_interval': '{INDEX_TOMBSTONE_COMPACTION_INTERVAL_S}'}}"
)

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
    "cells": f"""
        CREATE TABLE IF NOT EXISTS {{ks}}.cells (
            tbl text, shard int, row blob, col blob, PRIMARY KEY ((tbl, shard), row, col)
        ) WITH ID = {{id}} AND {_INDEX_OPTIONS.replace("{", "{{").replace("}", "}}")}""",
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


class CassandraConnection(KVStore):
    """The part of :class:`~storage_adapters.cassandra.CassandraStore` every operation
    shares: the connection and its execution profiles, the schema and the prepared
    statements, the shard count, and running requests (batched, retried while the
    driver cannot send, conditional writes). The reads and the writes build on it."""

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
    def _with_session(cls, url: str, session: Any, shards: int = DEFAULT_SHARDS) -> Self:
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

        def profile(level: Any, **extra: Any) -> ExecutionProfile:
            return ExecutionProfile(
                load_balancing_policy=TokenAwarePolicy(
                    DCAwareRoundRobinPolicy(local_dc=s.local_dc)
                ),
                consistency_level=level,
                request_timeout=s.timeout_s,
                row_factory=tuple_factory,
                **extra,
            )

        profiles = {
            EXEC_PROFILE_DEFAULT: profile(data_level),
            # The commit phase of a conditional write runs at the data level, its
            # Paxos rounds at the serial level; see ConditionalWriteRetryPolicy.
            "lwt": profile(
                data_level,
                serial_consistency_level=serial_level,
                retry_policy=ConditionalWriteRetryPolicy(),
            ),
            "serial_read": profile(serial_level),
            # Reads whose answer is safe from any one replica (rows written once and
            # the write times that delete them; see CassandraStore.get_system_final).
            "one_replica": profile(ConsistencyLevel.LOCAL_ONE),
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
        index = metadata.tables.get("cells") if metadata is not None else None
        if index is not None and index.options.get("gc_grace_seconds") != INDEX_GC_GRACE_S:
            # An index from before its tombstones went at the first compaction.
            log.info("setting the index options of %s.cells", ks)
            self._ddl(f"ALTER TABLE {ks}.cells WITH {_INDEX_OPTIONS}")

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
            # At the cell's newest timestamp written, not the client's clock: a prune
            # (below a safe point) never shadows the index row of a later version.
            index_cell=prepare(
                "INSERT INTO {ks}.cells (tbl, shard, row, col) VALUES (?, ?, ?, ?) "
                "USING TIMESTAMP ?"
            ),
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
            range_write_time=prepare(
                "SELECT MAX(WRITETIME(deleted)), COUNT(*) FROM {ks}.cell_versions "
                "WHERE tbl = ? AND cell = ? AND ts >= ? AND ts <= ?"
            ),
            delete_range=prepare(
                "DELETE FROM {ks}.cell_versions USING TIMESTAMP ? "
                "WHERE tbl = ? AND cell = ? AND ts >= ? AND ts <= ?"
            ),
            prune_run=prepare(
                "DELETE FROM {ks}.cells USING TIMESTAMP ? WHERE tbl = ? AND shard = ? "
                "AND (row, col) >= (?, ?) AND (row, col) <= (?, ?)"
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
            system_written_one=prepare(
                "SELECT key, value, WRITETIME(value) FROM {ks}.system_rows "
                "WHERE tbl = ? AND key = ?"
            ),
            system_written=prepare(
                "SELECT key, value, WRITETIME(value) FROM {ks}.system_rows "
                "WHERE tbl = ? AND key IN ?"
            ),
            delete_system_at=prepare(
                "DELETE FROM {ks}.system_rows USING TIMESTAMP ? WHERE tbl = ? AND key = ?"
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

    def _replica(self, table: str, key: bytes) -> Hashable:
        """The first replica of a cell's partition (``None`` when the driver has no
        token map): writes to partitions of one replica may share a batch, which the
        driver sends to that replica (it routes a batch by its first statement)."""
        return self._first_replica(_component(table.encode()) + _component(key))

    def _shard_replica(self, table: str, shard: int) -> Hashable:
        """The first replica of a shard's partition of the ``cells`` index."""
        return self._first_replica(
            _component(table.encode()) + _component(shard.to_bytes(4, "big", signed=True))
        )

    def _first_replica(self, routing_key: bytes) -> Hashable:
        token_map = None if self._cluster is None else self._cluster.metadata.token_map
        if token_map is None:
            return None
        token = token_map.token_class.from_key(routing_key)
        replicas = token_map.get_replicas(self.settings.keyspace, token)
        return replicas[0] if replicas else None

    def _per_cell(
        self,
        one: Any,
        many: Any,
        table: str,
        keys: list[bytes],
        rest: tuple[Any, ...],
        *,
        spread: int = 1,
    ) -> list[tuple[Any, tuple[Any, ...] | None]]:
        """Reads of cell partitions: ``_IN_LIMIT`` cells a request (``cell IN ?``), and a
        lone cell by ``cell = ?``, which the driver routes to a replica (token aware).

        ``spread`` > 1 (point reads: a commit's conflict check, a transaction's reads)
        spreads a call of few cells over about that many requests of at least
        ``_IN_MIN`` cells, cells of one first replica together. One ``IN`` of 100 cells
        is read by one coordinator thread, partition after partition; the same cells as
        8 requests of 13 are read by 8 threads at once (a commit's conflict check:
        12-14 ms against 8-10 ms on one node, docs/design/storage.md, "Round trips per
        commit"), and grouping by replica lets each coordinator read its cells locally.
        Scans keep ``spread`` 1: their pages already overlap, many shards at once.
        """
        groups: list[list[bytes]] = [keys]
        size = _IN_LIMIT
        if spread > 1:
            by_replica: dict[Hashable, list[bytes]] = {}
            for key in keys:
                by_replica.setdefault(self._replica(table, key), []).append(key)
            groups = list(by_replica.values())
            size = min(_IN_LIMIT, max(_IN_MIN, -(-len(keys) // spread)))
        queries: list[tuple[Any, tuple[Any, ...] | None]] = []
        for group in groups:
            for i in range(0, len(group), size):
                chunk = group[i : i + size]
                if len(chunk) == 1:
                    queries.append((one, (table, chunk[0], *rest)))
                else:
                    queries.append((many, (table, chunk, *rest)))
        return queries

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
        after: Sequence[FollowUp] = (),
    ) -> list[list[tuple[Any, ...]]]:
        """Run ``(statement, params)`` pairs, ``concurrency`` at a time; rows of each.

        Reads, and writes of versions (idempotent by the store contract), so a run
        that failed only because the driver could not send requests (:func:`never_sent`)
        is run again after a short pause, ``_BUSY_RETRIES`` times at most. The requests
        go through :func:`_send_window`: after a failure nothing more is sent, the ones
        in flight are awaited, and the error raised is the one that says least about
        what was applied (:func:`_worst_error`).

        ``after``: requests each sent only once every one of its prerequisites (indices
        into ``queries``) succeeded, in the same window; their rows follow those of
        ``queries``, in the order of ``after``. A run again sends everything again.
        """
        if not queries and not after:
            return []
        for follow_up in after:
            if not all(0 <= i < len(queries) for i in follow_up.prerequisites):
                raise ValueError(f"a follow-up names a request not in the call: {follow_up}")
        profile = profile or EXEC_PROFILE_DEFAULT
        for attempt in range(_BUSY_RETRIES + 1):
            try:
                if len(queries) == 1 and not after:
                    statement, params = queries[0]
                    rows = self._session.execute(statement, params, execution_profile=profile)
                    return [list(rows or ())]
                futures, errors = _send_window(
                    self._session, queries, profile, concurrency, after=after
                )
                if not errors:
                    # A ResultSet fetches any further page as it is listed.
                    return [list(future.result() or ()) for future in futures]
            except Exception as exc:
                if never_sent(exc) and attempt < _BUSY_RETRIES:
                    log.debug("Cassandra connection busy; sending again: %s", exc)
                    time.sleep(_BUSY_PAUSE_S * 2**attempt)
                    continue
                raise translate_error(exc, conditional_write=False, write=write) from exc
            if all(never_sent(e) for e in errors) and attempt < _BUSY_RETRIES:
                log.debug("Cassandra connection busy; sending again: %s", errors[0])
                time.sleep(_BUSY_PAUSE_S * 2**attempt)
                continue
            cause, error = _worst_error(errors, write=write)
            raise error from cause
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


class _Request:
    """One read sent asynchronously; ``rows()`` waits for its rows.

    A read the driver could not send (:func:`never_sent`: every socket buffer full,
    which a scan's many requests with long bounds can cause) is sent again,
    ``_BUSY_RETRIES`` times at most, as in :meth:`CassandraConnection._execute_all`.
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


# --- helpers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FollowUp:
    """A request of a call sent only after its ``prerequisites`` (indices of the
    call's other requests) all succeeded: a read that must see those writes."""

    query: tuple[Any, tuple[Any, ...] | None]
    prerequisites: frozenset[int]


def _send_window(
    session: Any,
    queries: Sequence[tuple[Any, tuple[Any, ...] | None]],
    profile: object,
    limit: int,
    *,
    after: Sequence[FollowUp] = (),
) -> tuple[list[Any], list[BaseException]]:
    """Send ``queries`` with ``execute_async``, at most ``limit`` in flight; wait for all.

    Returns the futures of the requests, in order (those of ``after`` last, in their
    order; ``None`` for a request never sent), and the errors, in the order they
    arrived. This thread sends ``queries``; the driver's event loop counts
    completions (``add_callbacks``), and the completion that releases a follow-up
    (its last prerequisite succeeded) sends it at once if the window has room (else
    this thread does, before the next request of ``queries``). A follow-up has no
    follow-ups of its own, so a send from a callback recurses one level at most, and
    a request finished before its callback was added is counted all the same. After
    the first error nothing more is sent, and this returns only once every request
    sent has finished, so no request of a failed call is still in flight when its
    caller moves on (to clean-up, say). It replaces the driver's
    ``execute_concurrent``, whose per-request bookkeeping cost a 100-cell commit's
    write several milliseconds of client CPU (measured in docs/design/storage.md,
    "Round trips per commit").
    """
    ready = threading.Condition()
    in_flight = 0
    errors: list[BaseException] = []
    futures: list[Any] = [None] * (len(queries) + len(after))
    # Prerequisites not yet succeeded, per follow-up; the follow-ups of each request.
    waiting = [len(f.prerequisites) for f in after]
    dependents: dict[int, list[int]] = {}
    for j, follow_up in enumerate(after):
        for i in follow_up.prerequisites:
            dependents.setdefault(i, []).append(j)
    released = collections.deque(j for j, count in enumerate(waiting) if not count)

    def send(slot: int) -> bool:
        """Send one request, counted in flight already; ``False`` if the driver refused it."""
        statement, params = (
            queries[slot] if slot < len(queries) else after[slot - len(queries)].query
        )
        try:
            future = session.execute_async(statement, params, execution_profile=profile)
        except Exception as exc:  # refused before sending: count it as a finished request
            failed(exc)
            return False
        futures[slot] = future
        future.add_callbacks(finished(slot), failed)
        return True

    def finished(index: int) -> Callable[[Any], None]:
        def callback(_result: Any = None) -> None:
            nonlocal in_flight
            now: list[int] = []
            with ready:
                in_flight -= 1
                for j in dependents.get(index, ()):
                    waiting[j] -= 1
                    if not waiting[j]:
                        released.append(j)
                # A follow-up released here goes out from here, within the window:
                # waking the calling thread to send it costs a thread switch per
                # request (up to the interpreter's 5 ms switch interval on a busy
                # machine), which is most of what sending it early saves.
                while released and not errors and in_flight < limit:
                    now.append(len(queries) + released.popleft())
                    in_flight += 1
                ready.notify()
            for slot in now:
                send(slot)

        return callback

    def failed(exc: BaseException) -> None:
        nonlocal in_flight
        with ready:
            in_flight -= 1
            errors.append(exc)
            ready.notify()

    unsent = 0  # the next request of ``queries`` to send
    while True:
        with ready:
            while not errors and (
                in_flight >= limit or (in_flight and not released and unsent == len(queries))
            ):
                ready.wait()
            if errors:
                break
            if released:
                slot = len(queries) + released.popleft()
            elif unsent < len(queries):
                slot, unsent = unsent, unsent + 1
            else:  # everything sent and finished; a follow-up still waiting never will
                break
            in_flight += 1
        if not send(slot):
            break
    with ready:
        while in_flight:
            ready.wait()
    return futures, errors


def _worst_error(
    errors: Sequence[BaseException], *, write: bool
) -> tuple[BaseException, Exception]:
    """The store error of a call whose concurrent requests failed with ``errors``, and
    the driver error it stands for.

    For a write, an unknown outcome (:class:`StoreTimeoutError`) wins over every other
    error: another request's refusal (``Unavailable``: not applied) says nothing about
    the request that timed out, which may have been applied, so the call as a whole
    stays "unknown" (rule S6), as that request failing alone would have reported.
    Otherwise the first error to arrive, as ``execute_concurrent`` raised it, passing
    over requests the driver never sent (refused before any I/O).
    """
    translated = [
        (exc, translate_error(exc, conditional_write=False, write=write)) for exc in errors
    ]
    if write:
        for exc, error in translated:
            if isinstance(error, StoreTimeoutError):
                return exc, error
    for exc, error in translated:
        if not never_sent(exc):
            return exc, error
    return translated[0]


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
