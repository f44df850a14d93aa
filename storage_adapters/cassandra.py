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
written has one row in ``cells`` until garbage collection prunes it (below), in one of
``shards`` partitions of its table
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
partition and upserts the cell's index row. Versions (and deletes) go as unlogged
batches of at most 10 partitions with the same first replica, which the driver sends
to that replica (ten writes a request: the Python driver's per-request cost, not the
server, bounds a client's write rate, and Cassandra warns about unlogged batches over
10 partitions); an index row shares those batches (by its shard partition's first
replica) unless its shard has 10 or more index rows in the call, which go as batches
of that one partition (issue 27: a commit of 100 cells sent ~42 requests, now ~20).
A call's requests are in flight together, 16 at most
(``CassandraConnection._execute_all``); it returns only when both landed, and the
committer never reaches its commit point after a failed ``put_versions`` (a store
error in the write step aborts), so a committed version always has its index row.
The index row is written ``USING TIMESTAMP`` the cell's version timestamp (the newest
in the call), not the client's clock: that is what makes pruning it safe.

Tombstones (issue 18 item 1). Clean-up deletes versions of aborted writers, and
Cassandra keeps each delete as a tombstone until ``gc_grace_seconds`` passed *and* a
compaction dropped it; a read crossing more than ``tombstone_failure_threshold``
(100,000) of them fails with ``READ_TOO_MANY_TOMBSTONES``. Format 1 kept every cell
of a shard in one partition and scanned it with ``GROUP BY``, crossing every tombstone
of the shard: 101,000 cleaned cells made every scan of the table fail. Now:

* a delete lands in its cell's own partition, so a read meets only tombstones of that
  cell, and only those between its snapshot and the newest live version below it (the
  versions of writers that aborted since the cell's last committed write);
* clean-up never touches the ``cells`` index; only garbage collection prunes it, one
  range tombstone per run of dead cells (below), so a scan crosses about one
  tombstone per live cell at most, and a request resolves at most ``_IN_LIMIT``
  cells, so it crosses that many version tombstones at most (the threshold counts
  per partition read);
* clean-up's deletes are row deletes, never ranges: above the safe point a range
  tombstone stamped above the doomed versions' write times would also cover a
  version written inside the range later by a client whose clock lags, perhaps a
  committed one (see :meth:`CassandraStore.delete_versions`). Below the safe point no
  such version can be written any more (rule S8), and garbage collection deletes runs
  of a cell's versions with one range tombstone each
  (:meth:`~storage_adapters._cassandra_sweep.CassandraSweeps.delete_version_ranges`);
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
  keeps one copy per level). Its gc_grace is 0 (``INDEX_GC_GRACE_S``): a pruned
  index row that comes back costs a scan one dead cell until the next prune, and
  purging a tombstone never hides a row, so the prune's tombstones go at the first
  compaction after their flush; a quiet index is flushed each minute and an SSTable
  of them is compacted alone once a minute old. Opening a keyspace made before sets
  these options.

Pruning the index (issue 27). A cell whose every version is gone keeps its index row,
and a scan reads it, until garbage collection calls
:meth:`~storage_adapters._cassandra_sweep.CassandraSweeps.prune_cells` with its safe
point ``sp``: each shard's index is read in pages, each cell checked for any version,
and each run of consecutive cells with none deleted by one range tombstone ``USING
TIMESTAMP sp - 1``. A version at or above ``sp`` writes its index row at its own
timestamp, above the tombstone's, so it survives the prune whenever it lands (last
write wins, a tie goes to the delete); one below ``sp`` that a reader needs existed
before the pass swept (S8), so its cell is not in a run. The argument in full is in
docs/design/storage.md, "Pruning the index". Index rows written before this change
carry client-clock timestamps, far above any oracle timestamp: they are never pruned,
never wrongly hidden.

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
:mod:`storage_adapters._cassandra_errors`; both are re-exported here. The store is split
by concern: the connection, schema, statements and request running in
:mod:`storage_adapters._cassandra_session` (``CassandraConnection``), the reads in
:mod:`storage_adapters._cassandra_reads` (``CassandraReads``), garbage collection's
range deletes and the index prune in :mod:`storage_adapters._cassandra_sweep`
(``CassandraSweeps``), and here the writes,
the deletes and stamps of garbage collection, and the system rows' conditional writes
(the commit point, rule S1).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from storage_adapters._base import (
    MAX_PAGE_SIZE,
    MAX_TIMESTAMP,
    CasResult,
    Cell,
    VersionStamp,
    VersionWrite,
    check_deletes,
    check_limit,
    check_stamps,
    check_system_deletes,
    check_system_key,
    check_system_write,
    check_table,
    check_writes,
)
from storage_adapters._cassandra_errors import ConditionalWriteRetryPolicy, translate_error
from storage_adapters._cassandra_session import (
    _IN_CONCURRENCY,
    _IN_SPREAD,
    CONCURRENCY,
    FollowUp,
    _bytes,
    cell_key,
)
from storage_adapters._cassandra_sweep import (
    _BATCH_BYTES,  # noqa: F401  (re-exported: the batching tests read it here)
    _CROSS_PARTITION_ROWS,
    _MAX_WRITE_TIME,
    CassandraSweeps,
    batched,
    tagged_batches,
)
from storage_adapters._cassandra_url import (
    DEFAULT_PORT,
    DEFAULT_SHARDS,
    CassandraSettings,
    parse_cassandra_url,
    shard_of,
)

#: What a write request carries, for a read that must follow it: the ``(table index,
#: cell key)`` of a version, ``None`` for an index row.
_VersionTag = tuple[int, bytes] | None

__all__ = [
    "CONCURRENCY",
    "DEFAULT_PORT",
    "DEFAULT_SHARDS",
    "CassandraSettings",
    "CassandraStore",
    "ConditionalWriteRetryPolicy",
    "batched",
    "cell_key",
    "parse_cassandra_url",
    "shard_of",
    "translate_error",
]


class CassandraStore(CassandraSweeps):
    """:class:`KVStore` on Apache Cassandra (see the module docstring for the layout).

    Reads come from :class:`~storage_adapters._cassandra_reads.CassandraReads`, range
    deletes and the index prune from
    :class:`~storage_adapters._cassandra_sweep.CassandraSweeps`, the
    connection and statements from
    :class:`~storage_adapters._cassandra_session.CassandraConnection`; here are the
    writes of versions, their deletes and commit stamps, and the system rows.
    """

    # --- versioned cells ------------------------------------------------------------

    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        """Write each version into its cell's partition and the cell into the index.

        Both land before this returns, or it raises: the committer never reaches its
        commit point after a failed ``put_versions`` (it aborts), so a committed version
        always has its index row and scans find it.
        """
        self.put_versions_of_tables([(table, versions)])

    def put_versions_of_tables(self, writes: Sequence[tuple[str, Sequence[VersionWrite]]]) -> None:
        """Every table's versions and index rows in one set of batches, sent together
        (as :meth:`put_versions` describes for one table): a replica's batch may hold
        rows of several tables."""
        checked = _checked_writes(writes)
        self._check_open()
        self._execute_all(self._write_queries(checked)[0], write=True, concurrency=_IN_CONCURRENCY)

    def put_versions_read_back_of_tables(
        self,
        writes: Sequence[tuple[str, Sequence[VersionWrite]]],
        *,
        limit: int | None = None,
    ) -> list[dict[Cell, list[int]]]:
        """:meth:`put_versions_of_tables`, and each written cell's version timestamps
        read back as :meth:`get_version_timestamps_of_tables` reads them, in the same
        window: a cell's read goes out as soon as every batch holding a version of it
        succeeded, not after the slowest batch of the call (a commit's write step and
        the first read of its conflict check, docs/design/storage.md, "The conflict
        check's read in the write round"). The reads are the conflict check's own
        (:meth:`get_version_timestamps_of_tables`: each table's cells spread over about
        ``_IN_SPREAD`` requests, cells of one first replica together), each waiting for
        the requests that carry its cells' versions only. Returns only
        once every write and read landed, or raises as a write would (a read failing
        after the writes leaves them written, as any failed write may)."""
        checked = _checked_writes(writes)
        limit = check_limit(limit)
        self._check_open()
        per_cell = MAX_PAGE_SIZE if limit is None else min(limit, MAX_PAGE_SIZE)
        queries, tags = self._write_queries(checked)
        # Each cell's read waits for every request carrying a version of it.
        needs: dict[tuple[int, bytes], set[int]] = {}
        for index, request_tags in enumerate(tags):
            for tag in request_tags:
                if tag is not None:
                    needs.setdefault(tag, set()).add(index)
        # Each table's cells as the conflict check spread them (_per_cell, spread: the
        # same requests), in the order their batches go out, so that a read's cells
        # share few batches; a read waits for the batches carrying its cells only.
        by_table: dict[int, list[bytes]] = {}
        for table_index, key in sorted(needs, key=lambda tag: min(needs[tag])):
            by_table.setdefault(table_index, []).append(key)
        bounds = (-1, MAX_TIMESTAMP - 1, per_cell)  # as get_version_timestamps_of_tables
        after: list[FollowUp] = []
        owners: list[int] = []
        for table_index, keys in by_table.items():
            table = checked[table_index][0]
            one, many = self._stmts.version_ts_one, self._stmts.version_ts
            for query in self._per_cell(one, many, table, keys, bounds, spread=_IN_SPREAD):
                read = query[1][1] if query[0] is many else [query[1][1]]  # type: ignore[index]
                carriers = frozenset().union(*(needs[(table_index, key)] for key in read))
                after.append(FollowUp(query, carriers))
                owners.append(table_index)
        results = self._execute_all(queries, write=True, concurrency=_IN_CONCURRENCY, after=after)[
            len(queries) :
        ]
        cells = [
            {cell_key(v.row, v.column): Cell(v.row, v.column) for v in vs} for _, vs in checked
        ]
        out: list[dict[Cell, list[int]]] = [{} for _ in checked]
        for table_index, rows in zip(owners, results, strict=True):
            for key, ts in rows:
                out[table_index].setdefault(cells[table_index][_bytes(key)], []).append(ts)
        for found in out:
            for tss in found.values():
                tss.sort(reverse=True)
        return out

    def _write_queries(
        self, checked: Sequence[tuple[str, Sequence[VersionWrite]]]
    ) -> tuple[list[tuple[Any, tuple[Any, ...] | None]], list[list[_VersionTag]]]:
        """The requests writing ``checked`` (versions and index rows), and for each the
        ``(table index, cell key)`` of every version it carries (``None`` for an index
        row)."""
        mixed: list[tuple[Hashable, Any, tuple[Any, ...], int, _VersionTag]] = []
        shard_items: list[tuple[Hashable, tuple[Any, ...], int]] = []
        for table_index, (table, table_writes) in enumerate(checked):
            self._put_items(table_index, table, table_writes, mixed, shard_items)
        tagged = tagged_batches(mixed, _CROSS_PARTITION_ROWS)
        index_queries = batched(self._stmts.index_cell, shard_items)
        queries = [query for query, _ in tagged] + index_queries
        no_versions: list[list[_VersionTag]] = [[None] for _ in index_queries]
        return queries, [tags for _, tags in tagged] + no_versions

    def _put_items(
        self,
        table_index: int,
        table: str,
        writes: Sequence[VersionWrite],
        mixed: list[tuple[Hashable, Any, tuple[Any, ...], int, _VersionTag]],
        shard_items: list[tuple[Hashable, tuple[Any, ...], int]],
    ) -> None:
        """Add one table's writes: ``mixed`` by first replica (each version tagged
        ``(table_index, cell key)``), ``shard_items`` by index partition (shards with
        ``_CROSS_PARTITION_ROWS`` index rows or more)."""
        # The last write of a version wins, as in the reference backend; within one
        # batch Cassandra would instead keep the greater value.
        latest = {(v.row, v.column, v.ts): v.value for v in writes}
        newest: dict[tuple[bytes, bytes], int] = {}  # each cell's newest ts in this call
        for (row, column, ts), value in latest.items():
            key = cell_key(row, column)
            mixed.append(
                (
                    self._replica(table, key),
                    self._stmts.insert_version,
                    (table, key, ts, value or b"", value is None),
                    len(value or b"") + 80,
                    (table_index, key),
                )
            )
            newest[row, column] = max(ts, newest.get((row, column), ts))
        # Each index row at its cell's newest timestamp here (see prune_cells).
        by_shard: dict[int, list[tuple[Any, ...]]] = {}
        for (row, column), ts in newest.items():
            shard = shard_of(row, self.shards)
            by_shard.setdefault(shard, []).append((table, shard, row, column, ts))
        # A shard with many index rows here gets batches of its own partition; the few
        # index rows of the other shards (a commit's usual case: one or two a shard) go
        # with the versions, batched by first replica: one request per replica and ten
        # rows instead of one request per shard (docs/design/storage.md, "Round trips
        # per commit").
        for shard, rows in by_shard.items():
            if len(rows) >= _CROSS_PARTITION_ROWS:
                shard_items += [((table, shard), p, len(p[2]) + len(p[3]) + 32) for p in rows]
                continue
            replica = self._shard_replica(table, shard)
            mixed += [
                (replica, self._stmts.index_cell, p, len(p[2]) + len(p[3]) + 32, None) for p in rows
            ]

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
            batched(self._stmts.stamp, updates, _CROSS_PARTITION_ROWS),
            write=True,
            concurrency=_IN_CONCURRENCY,
        )

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
            batched(self._stmts.delete_version, deletes, _CROSS_PARTITION_ROWS),
            write=True,
            concurrency=_IN_CONCURRENCY,
        )

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

    def get_system_final(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """From one replica (``LOCAL_ONE``), ``_IN_LIMIT`` keys a request, then SERIAL for
        the keys not found there. A value in the table was put there by the commit of a
        Paxos round that chose it (proposals wait in Paxos's own table until then), so
        it is the row's for good, whichever replica holds it; a replica the commit has
        not reached yet leaves the key out, and the SERIAL read decides it."""
        check_table(table)
        wanted = list(dict.fromkeys(check_system_key(table, k) for k in keys))
        self._check_open()
        found = {key: value for key, (value, _) in self._written_system(table, wanted).items()}
        if len(found) < len(wanted):
            found.update(self.get_system(table, [k for k in wanted if k not in found]))
        return found

    def delete_system_many(self, table: str, rows: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """Each row's value and write time read from one replica, then a tombstone
        ``USING TIMESTAMP`` that write time for each row that holds ``expected``,
        unlogged batches of partitions of one replica, no Paxos: garbage collection's
        entry deletes, one per writer it collects (25,000 a pass over a long history).

        The tombstone removes exactly the write read and anything older (a tie goes to
        the delete). Every later write of the key is a Paxos commit, whose timestamp is
        its ballot's, above every earlier ballot of the partition and so above the one
        read: it stays. So a row rewritten between the read and the delete is never
        deleted, as with ``IF value = ?`` (docs/design/storage.md, "Deleting final
        rows"). A replica that missed a write can only make a row be left, never a newer
        write be deleted."""
        check_system_deletes(table, rows)
        self._check_open()
        wanted = dict(rows)
        written = self._written_system(table, list(wanted))
        deletes: list[tuple[Hashable, tuple[Any, ...], int]] = []
        for key, expected in wanted.items():
            found = written.get(key)
            if found is not None and found[0] == expected:
                deletes.append((self._replica(table, key), (found[1], table, key), 40))
        self._execute_all(
            batched(self._stmts.delete_system_at, deletes, _CROSS_PARTITION_ROWS),
            write=True,
            concurrency=_IN_CONCURRENCY,
        )
        deleted = {params[2] for _, params, _ in deletes}
        return [key in deleted for key, _ in rows]

    def _written_system(self, table: str, keys: Sequence[bytes]) -> dict[bytes, tuple[bytes, int]]:
        """``key -> (value, write time)`` of the rows one replica holds (``LOCAL_ONE``:
        with a replication factor of 3 on 3 nodes, every read is local); ``keys``
        checked and distinct."""
        queries = self._per_cell(
            self._stmts.system_written_one,
            self._stmts.system_written,
            table,
            list(keys),
            (),
            spread=_IN_SPREAD,
        )
        found: dict[bytes, tuple[bytes, int]] = {}
        rows_of = self._execute_all(
            queries, write=False, profile="one_replica", concurrency=_IN_CONCURRENCY
        )
        for rows in rows_of:
            for key, value, write_time in rows:
                found[_bytes(key)] = (_bytes(value), int(write_time))
        return found


def _checked_writes(
    writes: Sequence[tuple[str, Sequence[VersionWrite]]],
) -> list[tuple[str, list[VersionWrite]]]:
    """``writes`` with each table name and its versions checked (``ValueError`` naming
    the first bad one), before anything is sent."""
    checked = []
    for table, versions in writes:
        check_table(table)
        checked.append((table, check_writes(versions)))
    return checked
