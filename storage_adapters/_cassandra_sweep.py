"""The Cassandra store's sweeping below a safe point: range deletes of versions and the
pruning of the ``cells`` index (the layout is in :mod:`storage_adapters.cassandra`'s
docstring; the argument for both in docs/design/storage.md, "Pruning the index").

Both write range tombstones, and both are safe only because of what their caller
guarantees: garbage collection passes its published safe point, after the grace, and
below it no writer that may still commit writes anything (rule S8).

* :meth:`CassandraSweeps.delete_version_ranges`: one range tombstone per cell and range
  (``ts >= low AND ts <= high`` in the cell's partition) instead of one row tombstone
  per version. Stamped above the newest write time found in the range (read first, one
  aggregate per range), like :meth:`~storage_adapters.cassandra.CassandraStore.delete_versions`.
* :meth:`CassandraSweeps.prune_cells`: the runs of consecutive index rows whose cells
  hold no version at all go, one range tombstone per run, at the write timestamp
  ``below_ts - 1``. Index rows are written at their cell's version timestamp
  (``put_versions``), so the prune shadows only index writes of versions below
  ``below_ts``: a later version's index row always wins (last write wins, and a
  delete wins a tie only).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cassandra.query import BatchStatement, BatchType

from storage_adapters._base import (
    MAX_TIMESTAMP,
    Cell,
    ScanEntry,
    check_cells,
    check_ranges,
    check_table,
    check_ts,
)
from storage_adapters._cassandra_reads import CassandraReads
from storage_adapters._cassandra_session import _IN_CONCURRENCY, _IN_LIMIT, _bytes, cell_key
from storage_adapters._cassandra_url import shard_of

#: What a caller tags each write of tagged_batches with.
Tag = TypeVar("Tag")

# Writes to one partition go as one unlogged batch (one mutation, one request), kept
# under Cassandra's batch_size_warn_threshold (5 KiB) so that no batch logs a warning.
_BATCH_BYTES = 4096
_BATCH_ROWS = 100
# Writes to different partitions (versions of different cells, their deletes) share a
# batch only when one replica holds them all, and at most this many: Cassandra warns
# above unlogged_batch_across_partitions_warn_threshold (10). Ten rows a request cut
# the driver's per-request cost (the bottleneck of a Python client) about tenfold.
_CROSS_PARTITION_ROWS = 10
# The largest write timestamp Cassandra takes (a signed 64-bit count of microseconds).
_MAX_WRITE_TIME = (1 << 63) - 1

#: Index rows a prune reads per request; their cells are checked ``_IN_LIMIT`` a request.
PRUNE_PAGE_CELLS = 1000
#: A prune of named cells reads at most this many index rows per named cell of a shard
#: (plus a page): between the first and the last of them, the shard's other rows too.
PRUNE_SPAN_ROWS_PER_CELL = 4


@dataclass(frozen=True, slots=True)
class DeadRun:
    """Consecutive index rows of one shard, ``first`` to ``last`` included, whose
    ``cells`` cells held no version when read."""

    shard: int
    first: tuple[bytes, bytes]
    last: tuple[bytes, bytes]
    cells: int


class CassandraSweeps(CassandraReads):
    """Range deletes of versions and the index prune (see the module docstring)."""

    def delete_version_ranges(
        self, table: str, ranges: Sequence[tuple[bytes, bytes, int, int]]
    ) -> int:
        """One range tombstone per ``(row, column, low_ts, high_ts)``, above the newest
        write time in the range (read first: ``MAX(WRITETIME(deleted))`` and the count,
        one request per range); a range of one timestamp is a row delete above its
        version's write time, read ``_IN_LIMIT`` cells a request, as in
        ``delete_versions``. A range found empty is left alone.

        The tombstone beats every write of the versions found and every late copy of
        them, whatever the clients' clocks. It also covers a version written into the
        range later with a lagging clock: the caller's guarantee (below the safe point,
        rule S8) is what makes that a version no reader needs.
        """
        check_table(table)
        wanted = list(dict.fromkeys(check_ranges(ranges)))
        self._check_open()
        # A range of one timestamp (an aborted writer's version, most of what a pass
        # deletes) reads its write time with others of that timestamp, cell IN ?, and
        # goes as a row delete, as delete_versions does: no aggregate read per cell.
        singles = [(c.row, c.column, low) for c, low, high in wanted if low == high]
        spans = [(c, low, high) for c, low, high in wanted if low != high]
        keys = [cell_key(cell.row, cell.column) for cell, _, _ in spans]
        reads = [
            (self._stmts.range_write_time, (table, key, low, high))
            for key, (_, low, high) in zip(keys, spans, strict=True)
        ]
        found = self._execute_all(reads, write=False, concurrency=_IN_CONCURRENCY)
        written = self._write_times(table, singles) if singles else {}
        now = self._session.cluster.timestamp_generator()
        rows: list[tuple[Hashable, tuple[Any, ...], int]] = []
        ranged: list[tuple[Hashable, tuple[Any, ...], int]] = []
        count = len(written)
        for (key, ts), write_time in written.items():
            at = min(max(now, write_time + 1), _MAX_WRITE_TIME)
            rows.append((self._replica(table, key), (at, table, key, ts), 60))
        for key, (_, low, high), result in zip(keys, spans, found, strict=True):
            newest, versions = result[0] if result else (None, 0)
            if not versions:
                continue
            count += versions
            at = now if newest is None else min(max(now, newest + 1), _MAX_WRITE_TIME)
            ranged.append((self._replica(table, key), (at, table, key, low, high), 60))
        self._execute_all(
            batched(self._stmts.delete_version, rows, _CROSS_PARTITION_ROWS)
            + batched(self._stmts.delete_range, ranged, _CROSS_PARTITION_ROWS),
            write=True,
            concurrency=_IN_CONCURRENCY,
        )
        return count

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

    def sweep_candidates(
        self,
        table: str,
        below_ts: int,
        stamped_below: int,
        *,
        start_row: bytes = b"",
        start_column: bytes = b"",
        page_size: int = 1000,
    ) -> Iterator[Cell]:
        """The cells :meth:`scan` finds below ``below_ts``, less those whose newest
        version below it is a value stamped below ``stamped_below`` with no older
        version below it (issue 27): the scan already reads each cell's newest version
        and its stamp, so only those settled-looking cells cost one more read, of at
        most two version timestamps (no values), ``get_version_timestamps`` of the
        page. Before, every cell went to the collector, which read all its versions
        again: on one node, passes over a lakehouse table of 10,000 appends read some
        17,000 cells where SQLite's filter leaves 3,000, and took 11-22 s.

        Exact when nothing writes below ``below_ts`` meanwhile; a version written there
        later is one garbage-collection's caller says no reader needs (rule S8), and
        the next pass meets its cell."""
        entries = self.scan(
            table, start_row, None, below_ts, start_column=start_column, page_size=page_size
        )
        check_ts("stamped_below", stamped_below)
        return self._with_work(table, entries, below_ts, stamped_below, page_size)

    def _with_work(
        self,
        table: str,
        entries: Iterator[ScanEntry],
        below_ts: int,
        stamped_below: int,
        page_size: int,
    ) -> Iterator[Cell]:
        """:meth:`sweep_candidates`'s filter over ``entries``, a page at a time."""
        while page := list(itertools.islice(entries, page_size)):
            settled = [
                Cell(e.row, e.column)
                for e in page
                if e.value is not None and e.commit_ts is not None and e.commit_ts < stamped_below
            ]
            found = (
                self.get_version_timestamps(table, settled, below_ts=below_ts, limit=2)
                if settled
                else {}
            )
            alone = {cell for cell in settled if len(found.get(cell, ())) < 2}
            for entry in page:
                cell = Cell(entry.row, entry.column)
                if cell not in alone:
                    yield cell

    def prune_cells(self, table: str, below_ts: int) -> int:
        """Drop the index rows of cells with no version, shard by shard, one range
        tombstone per run of them at write timestamp ``below_ts - 1``.

        Why no version written concurrently is hidden (docs/design/storage.md, "Pruning
        the index"): a version at or above ``below_ts`` writes its index row at its own
        timestamp, above the tombstone's, so it wins whenever it lands; a version below
        ``below_ts`` that existed when its cell was read keeps its cell out of every run;
        and one written below ``below_ts`` after that is one the caller says no reader
        needs (below the safe point: its writer never commits, rule S8).
        """
        check_table(table)
        check_ts("below_ts", below_ts)
        self._check_open()
        if below_ts == 0:
            return 0  # nothing lies below timestamp 0
        return sum(
            self._prune_all(table, self._dead_runs(table, shard), below_ts)
            for shard in range(self.shards)
        )

    def prune_emptied_cells(self, table: str, below_ts: int, cells: Sequence[Cell]) -> int:
        """:meth:`prune_cells` over the index rows between the first and the last of
        ``cells`` of each shard only (the cells a garbage-collection pass just emptied),
        reading at most ``PRUNE_SPAN_ROWS_PER_CELL`` index rows per cell of a shard and
        a page: what is left goes at the next full prune. Each run is one the full prune
        could make (consecutive index rows read and found without a version), deleted
        the same way, so its argument holds unchanged (docs/design/storage.md, "Pruning
        the index"); naming cells only narrows where it looks."""
        check_table(table)
        check_ts("below_ts", below_ts)
        cells = check_cells(cells)
        self._check_open()
        if below_ts == 0 or not cells:
            return 0
        by_shard: dict[int, list[tuple[bytes, bytes]]] = {}
        for cell in cells:
            by_shard.setdefault(shard_of(cell.row, self.shards), []).append((cell.row, cell.column))
        pruned = 0
        for shard, named in sorted(by_shard.items()):
            named.sort()
            budget = PRUNE_SPAN_ROWS_PER_CELL * len(named) + PRUNE_PAGE_CELLS
            runs = self._dead_runs(table, shard, named[0], named[-1], budget)
            pruned += self._prune_all(table, runs, below_ts)
        return pruned

    def _prune_all(self, table: str, runs: Iterable[DeadRun], below_ts: int) -> int:
        """:meth:`_prune_runs` of ``runs`` as they are found, ``_BATCH_ROWS`` at a time."""
        pruned, found = 0, iter(runs)
        while batch := list(itertools.islice(found, _BATCH_ROWS)):
            pruned += self._prune_runs(table, batch, below_ts)
        return pruned

    def _dead_runs(
        self,
        table: str,
        shard: int,
        start: tuple[bytes, bytes] = (b"", b""),
        end: tuple[bytes, bytes] | None = None,
        budget: int | None = None,
    ) -> Iterator[DeadRun]:
        """The runs of consecutive index rows of ``shard`` whose cells hold no version
        (of any timestamp) when read, in index order; a cell with a version ends a run.
        Only rows from ``start`` to ``end`` (included; ``None``: the shard's last) are
        read, about ``budget`` at most (``None``: no limit). Reads only:
        :meth:`_prune_runs` deletes them."""
        stmts = self._stmts
        cursor, inclusive = start, True
        first: tuple[bytes, bytes] | None = None
        last = first
        cells_in_run = 0
        read = 0
        while True:
            statement = stmts.index_from if inclusive else stmts.index_after
            page = PRUNE_PAGE_CELLS
            if budget is not None:
                page = max(1, min(page, budget - read))
            rows = self._execute_all([(statement, (table, shard, *cursor, page))], write=False)[0]
            cells = [(_bytes(r), _bytes(c)) for r, c in rows]
            read += len(cells)
            full = len(cells) == page
            if end is not None and cells and cells[-1] > end:
                cells = [cell for cell in cells if cell <= end]
                full = False
            keys = [cell_key(r, c) for r, c in cells]
            # Any version at all, newest first: one row per cell that has one.
            queries = self._per_cell(
                stmts.version_ts_one, stmts.version_ts, table, keys, (-1, MAX_TIMESTAMP, 1)
            )
            alive: set[bytes] = set()
            for found in self._execute_all(queries, write=False, concurrency=_IN_CONCURRENCY):
                alive.update(_bytes(key) for key, _ in found)
            for cell, key in zip(cells, keys, strict=True):
                if key not in alive:
                    first = first or cell
                    last = cell
                    cells_in_run += 1
                elif first is not None and last is not None:
                    yield DeadRun(shard, first, last, cells_in_run)
                    first, last, cells_in_run = None, None, 0
            if not full or (budget is not None and read >= budget):
                break
            cursor, inclusive = cells[-1], False
        if first is not None and last is not None:
            yield DeadRun(shard, first, last, cells_in_run)

    def _prune_runs(self, table: str, runs: Sequence[DeadRun], below_ts: int) -> int:
        """Delete each run's index rows with one range tombstone at ``below_ts - 1``:
        it shadows the index writes of versions below ``below_ts`` only."""
        if not runs or below_ts == 0:
            return 0
        items: list[tuple[Hashable, tuple[Any, ...], int]] = [
            (
                run.shard,
                (below_ts - 1, table, run.shard, *run.first, *run.last),
                sum(len(part) for part in (*run.first, *run.last)) + 40,
            )
            for run in runs
        ]
        self._execute_all(
            batched(self._stmts.prune_run, items), write=True, concurrency=_IN_CONCURRENCY
        )
        return sum(run.cells for run in runs)


def batched(
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
    return batched_writes(
        [(group, statement, params, size) for group, params, size in items], max_rows
    )


def batched_writes(
    items: Sequence[tuple[Hashable, Any, tuple[Any, ...], int]],
    max_rows: int = _BATCH_ROWS,
) -> list[tuple[Any, tuple[Any, ...] | None]]:
    """``(group, statement, params, approximate bytes)`` writes as unlogged batches of
    one group each, ``max_rows`` and ``_BATCH_BYTES`` at most, as :func:`batched`;
    writes of different statements (tables) may share a batch."""
    return [
        query
        for query, _ in tagged_batches(
            [(group, statement, params, size, None) for group, statement, params, size in items],
            max_rows,
        )
    ]


def tagged_batches(
    items: Sequence[tuple[Hashable, Any, tuple[Any, ...], int, Tag]],
    max_rows: int = _BATCH_ROWS,
) -> list[tuple[tuple[Any, tuple[Any, ...] | None], list[Tag]]]:
    """:func:`batched_writes` of ``(group, statement, params, approximate bytes, tag)``
    writes, each request with the tags of the writes it carries (in order): which
    request a later read of a written row must wait for."""
    by_group: dict[Hashable, list[tuple[Any, tuple[Any, ...], int, Tag]]] = {}
    for group, statement, params, size, tag in items:
        by_group.setdefault(group, []).append((statement, params, size, tag))
    out: list[tuple[tuple[Any, tuple[Any, ...] | None], list[Tag]]] = []

    def flush(chunk: list[tuple[Any, tuple[Any, ...], Tag]]) -> None:
        tags = [tag for _, _, tag in chunk]
        if len(chunk) == 1:
            out.append(((chunk[0][0], chunk[0][1]), tags))
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.is_idempotent = True
        for statement, params, _ in chunk:
            batch.add(statement, params)
        out.append(((batch, None), tags))

    for entries in by_group.values():
        chunk: list[tuple[Any, tuple[Any, ...], Tag]] = []
        chunk_bytes = 0
        for statement, params, size, tag in entries:
            if chunk and (chunk_bytes + size > _BATCH_BYTES or len(chunk) >= max_rows):
                flush(chunk)
                chunk, chunk_bytes = [], 0
            chunk.append((statement, params, tag))
            chunk_bytes += size
        if chunk:
            flush(chunk)
    return out
