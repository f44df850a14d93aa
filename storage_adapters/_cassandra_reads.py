"""The Cassandra store's reads: newest versions, scans over the sharded index, version
timestamps and histories (the layout is in :mod:`storage_adapters.cassandra`'s docstring).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any

from storage_adapters._base import (
    MAX_PAGE_SIZE,
    MAX_TIMESTAMP,
    Cell,
    ScanEntry,
    Version,
    check_cells,
    check_limit,
    check_table,
    check_ts,
    clamp_scan_bounds,
)
from storage_adapters._cassandra_session import (
    _IN_CONCURRENCY,
    _IN_SPREAD,
    CassandraConnection,
    _bytes,
    _Request,
    _value,
    cell_key,
)
from storage_adapters._cassandra_url import shard_of

#: Scans read a shard's index at most this many cells per request, and resolve them in
#: requests of ``_IN_LIMIT`` cells: with two pages in flight per shard, a 32-shard scan
#: keeps at most ~25,600 cell reads (256 requests) outstanding.
SCAN_PAGE_CELLS = 400


class CassandraReads(CassandraConnection):
    """Reads of versioned cells. Each reads a cell's partition of ``cell_versions`` by
    its ``cell_key``, ``_IN_LIMIT`` cells a request; a scan pages the shards of the
    ``cells`` index and resolves each page (:class:`_ShardScan`)."""

    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        self._check_open()
        keys = {cell_key(c.row, c.column): c for c in wanted}
        queries = self._per_cell(
            self._stmts.latest_one,
            self._stmts.latest,
            table,
            list(keys),
            (below_ts,),
            spread=_IN_SPREAD,
        )
        out: dict[Cell, Version] = {}
        for rows in self._execute_all(queries, write=False, concurrency=_IN_CONCURRENCY):
            for key, ts, value, deleted, commit_ts in rows:
                out[keys[_bytes(key)]] = Version(ts, _value(value, deleted), commit_ts)
        return out

    def _read_tables(
        self,
        checked: Sequence[tuple[str, Sequence[Cell]]],
        one: Any,
        many: Any,
        bounds: tuple[Any, ...],
    ) -> Iterator[tuple[int, dict[bytes, Cell], Any]]:
        """Point reads of every table's cells in one window of requests, each table's as
        :meth:`_per_cell` spreads them (``one``/``many``: its statements for one cell and
        several, ``bounds``: their trailing values). Yields each request's rows with the
        index of its table and that table's cells by key."""
        queries: list[tuple[Any, tuple[Any, ...] | None]] = []
        owners: list[int] = []  # the index in ``checked`` of each query's table
        keys: list[dict[bytes, Cell]] = []
        for index, (table, wanted) in enumerate(checked):
            table_keys = {cell_key(c.row, c.column): c for c in wanted}
            keys.append(table_keys)
            table_queries = self._per_cell(
                one, many, table, list(table_keys), bounds, spread=_IN_SPREAD
            )
            queries += table_queries
            owners += [index] * len(table_queries)
        results = self._execute_all(queries, write=False, concurrency=_IN_CONCURRENCY)
        for index, rows in zip(owners, results, strict=True):
            yield index, keys[index], rows

    def get_latest_of_tables(
        self, reads: Sequence[tuple[str, Sequence[tuple[bytes, bytes]]]], below_ts: int
    ) -> list[dict[Cell, Version]]:
        """Every table's cells read together: one window of requests for all of them,
        each as :meth:`get_latest` sends them for one table (a group commit's head and
        marks in one round instead of two)."""
        checked = _checked_reads(reads)
        check_ts("below_ts", below_ts)
        self._check_open()
        out: list[dict[Cell, Version]] = [{} for _ in checked]
        tables = self._read_tables(checked, self._stmts.latest_one, self._stmts.latest, (below_ts,))
        for index, keys, rows in tables:
            for key, ts, value, deleted, commit_ts in rows:
                out[index][keys[_bytes(key)]] = Version(ts, _value(value, deleted), commit_ts)
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
            spread=_IN_SPREAD,
        )
        out: dict[Cell, list[int]] = {}
        for rows in self._execute_all(queries, write=False, concurrency=_IN_CONCURRENCY):
            for key, ts in rows:
                out.setdefault(keys[_bytes(key)], []).append(ts)
        for tss in out.values():
            tss.sort(reverse=True)  # one partition's rows come newest first; this is cheap
        return out

    def get_version_timestamps_of_tables(
        self,
        reads: Sequence[tuple[str, Sequence[tuple[bytes, bytes]]]],
        *,
        limit: int | None = None,
    ) -> list[dict[Cell, list[int]]]:
        """Every table's cells read together: one set of requests for all of them,
        each as :meth:`get_version_timestamps` sends them for one table."""
        checked = _checked_reads(reads)
        limit = check_limit(limit)
        self._check_open()
        per_cell = MAX_PAGE_SIZE if limit is None else min(limit, MAX_PAGE_SIZE)
        out: list[dict[Cell, list[int]]] = [{} for _ in checked]
        # The bounds get_version_timestamps sends for its defaults (above_ts -1, below_ts
        # MAX_TIMESTAMP): -1 < ts <= MAX_TIMESTAMP - 1.
        bounds = (-1, MAX_TIMESTAMP - 1, per_cell)
        tables = self._read_tables(
            checked, self._stmts.version_ts_one, self._stmts.version_ts, bounds
        )
        for index, keys, rows in tables:
            for key, ts in rows:
                out[index].setdefault(keys[_bytes(key)], []).append(ts)
        for found in out:
            for tss in found.values():
                tss.sort(reverse=True)
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
            self._stmts.versions_one,
            self._stmts.versions,
            table,
            list(keys),
            (below_ts, per_cell),
            spread=_IN_SPREAD,
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

    def tables(self) -> list[str]:
        self._check_open()
        rows = self._execute_all([(self._stmts.tables, ())], write=False)[0]
        return sorted({tbl for tbl, _ in rows})


class _ShardScan:
    """One shard's part of a scan: index pages resolved to each cell's newest version.

    A page of the shard's ``cells`` index (sorted by row, column) is resolved through
    ``cell_versions`` (``PER PARTITION LIMIT 1`` below the scan timestamp), and cells
    without such a version are skipped. While a page is consumed the next one is
    already read and being resolved: two pages in flight per shard.
    """

    def __init__(
        self,
        store: CassandraConnection,
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


def _checked_reads(
    reads: Sequence[tuple[str, Sequence[tuple[bytes, bytes]]]],
) -> list[tuple[str, list[Cell]]]:
    """``reads`` with each table name and its cells checked (``ValueError`` naming the
    first bad one)."""
    checked = []
    for table, cells in reads:
        check_table(table)
        checked.append((table, check_cells(cells)))
    return checked
