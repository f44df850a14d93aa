"""percolake on Apache Cassandra against Cassandra alone, same node, same run.

Writes: the same cells written two ways, one client thread each:

* raw: prepared ``INSERT``s into a plain table ``((row), col) -> value`` at QUORUM,
  the N cells of one "transaction" sent together with ``execute_concurrent``;
* raw batched: the same cells into a table laid out like percolake's
  (``((tbl, shard), row, col)``), one unlogged batch per partition: the fewest requests
  Cassandra alone needs, which is what the store itself sends for a commit's versions;
* percolake: ``TransactionManager.embedded(url)``, one transaction of N puts, commit.

For N = 1, 10, 100, 1000 the figures are cells/s on each side and the ratios
``cassandra.txn_vs_raw.cellsN.ratio`` (against plain inserts, the contract's figure;
Percolator wrote at 0.23 of Bigtable) and ``cassandra.txn_vs_raw_batched.cellsN.ratio``.

Scans: one logical table of 1,000,000 cells (50,000 with ``--quick``) listed in key
order through ``KVStore.scan`` (a k-way merge over the table's shards), against a
plain token-order ``SELECT`` of the same rows from the raw table.

Sweeping (issue 27), in keyspaces of their own on the same node:

* ``cassandra.scan.after_dead_cellsN.vs_live_only.ratio``: a full scan of a table whose
  2 live cells sit among N = 100,000 cleaned cells (10,000 with ``--quick``; each
  written once and removed with ``delete_versions``, as the cleaner does), after
  ``prune_cells`` (what a garbage-collection pass runs) and two minutes of other writes
  (Cassandra flushes and compacts the index's tombstones away meanwhile), over the same
  scan of a fresh table holding the 2 live cells only; goal <= 2. The scan right after
  the prune (``...right_after_prune...``), the scan before it and the prune itself are
  timed too.
* ``cassandra.gc.cell_versions25000.*``: one cell of 25,000 committed versions
  (25,000 writers, each with its transactions-table entry), one
  ``GarbageCollector.run_once`` at retention 0 over it: the pass's seconds; and the
  deletes alone, 24,999 versions of a cell of its own each way: ``delete_versions``
  (one row tombstone a version, the way passes deleted before) against
  ``delete_version_ranges`` (one range tombstone).

Commits on Cassandra against their floor (issue 27): ``lakehouse.appends.cassandraN.
group_commit.vs_floor.ratio``, from :mod:`bench.bench_cassandra_floor`, on the same
cluster (``--only-commit`` runs the write figures and this one only; with ``--url`` of a
three-node cluster the names say ``cassandra3``, and the write figures are named
``cassandra3.txn_vs_raw...`` instead of ``cassandra.txn_vs_raw...``).

Reads after a million cleaned versions and on a cell of 100,000 versions:
:mod:`bench.bench_cassandra_history` (``cassandra.tombstones.*``,
``cassandra.long_history.*``), run on the same node.

Without ``--url`` a one-node Cassandra is started in a temporary directory (jars from
the cache, fetched on first use) and stopped afterwards, inside the benchmark's own
process tree. Runs are paired: each run times every system back to back, so ratios
compare runs made under the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import tenacity

from bench._results import Figure, Growth, Latency, MachineLoad, Result, summarize
from storage_adapters import (
    MAX_TIMESTAMP,
    StoreTimeoutError,
    StoreUnavailableError,
    VersionWrite,
    open_store,
)
from storage_adapters.cassandra import CONCURRENCY, CassandraStore, batched, shard_of
from txn import TransactionManager

log = logging.getLogger(__name__)

TXN_SIZES = (1, 10, 100, 1000)
VALUE = b"x" * 64
RAW_ANCHOR = "raw prepared INSERTs of the same cells, same Cassandra node, same run"
BATCHED_ANCHOR = "raw unlogged batches per partition of the same cells, same node, same run"
RATIO_ANCHOR = (
    "Percolator (OSDI'10): 0.23 of raw Bigtable; AtlasDB folklore ~0.85 on Cassandra "
    "(unsourced); Haeinsa ~0.9"
)
SCAN_ANCHOR = "plain SELECT of the same rows in token (unordered) order, same run"


@contextlib.contextmanager
def cassandra_url(url: str | None) -> Iterator[str]:
    """The URL given, or that of a fresh one-node Cassandra started for the run."""
    if url:
        yield url
        return
    from percolake.tools.cassandra import start_on_free_ports

    with tempfile.TemporaryDirectory(prefix="percolake-bench-") as tmp:
        cluster = start_on_free_ports(1, Path(tmp) / "cluster", cluster_name="percolake-bench")
        try:
            yield cluster.store_url("percolake_bench")
        finally:
            cluster.stop()


def _cells(batch: int, size: int) -> list[tuple[bytes, bytes]]:
    return [(f"b{batch:08d}-{c:04d}".encode(), b"v") for c in range(size)]


class RawWriter:
    """Cassandra without percolake: one plain table, prepared inserts."""

    def __init__(self, store: CassandraStore) -> None:
        self.session: Any = store._session
        keyspace = '"' + store.settings.keyspace + '"'
        self.session.execute(
            f"CREATE TABLE IF NOT EXISTS {keyspace}.raw_cells "
            "(row blob, col blob, value blob, PRIMARY KEY ((row), col))"
        )
        self.insert = self.session.prepare(
            f"INSERT INTO {keyspace}.raw_cells (row, col, value) VALUES (?, ?, ?)"
        )
        self.select_all = f"SELECT row, col, value FROM {keyspace}.raw_cells"
        self.session.execute(
            f"CREATE TABLE IF NOT EXISTS {keyspace}.raw_sharded (tbl text, shard int, "
            "row blob, col blob, value blob, PRIMARY KEY ((tbl, shard), row, col))"
        )
        self.insert_sharded = self.session.prepare(
            f"INSERT INTO {keyspace}.raw_sharded (tbl, shard, row, col, value) "
            "VALUES (?, ?, ?, ?, ?)"
        )
        self.shards = store.shards

    def write(self, cells: list[tuple[bytes, bytes]]) -> None:
        from cassandra.concurrent import execute_concurrent_with_args

        params = [(row, col, VALUE) for row, col in cells]
        if len(params) == 1:
            self.session.execute(self.insert, params[0])
            return
        execute_concurrent_with_args(
            self.session, self.insert, params, concurrency=CONCURRENCY, raise_on_first_error=True
        )

    def write_batched(self, cells: list[tuple[bytes, bytes]]) -> None:
        from cassandra.concurrent import execute_concurrent

        items = []
        for row, col in cells:
            shard = shard_of(row, self.shards)
            items.append((shard, ("bench", shard, row, col, VALUE), len(row) + len(VALUE) + 32))
        queries = batched(self.insert_sharded, items)
        if len(queries) == 1:
            self.session.execute(*queries[0])
            return
        execute_concurrent(
            self.session, queries, concurrency=CONCURRENCY, raise_on_first_error=True
        )

    def scan_unordered(self, fetch_size: int = 5000) -> int:
        from cassandra.query import SimpleStatement

        statement = SimpleStatement(self.select_all, fetch_size=fetch_size)
        return sum(1 for _ in self.session.execute(statement))


def cells_per_second(
    write_one: Callable[[list[tuple[bytes, bytes]]], None],
    size: int,
    seconds: float,
    batches: Iterator[int],
    latencies_ms: list[float],
) -> float:
    """Write batches of ``size`` cells for about ``seconds`` (at least twice), adding
    each batch's latency to ``latencies_ms``."""
    done = 0
    started = time.monotonic()
    while done < 2 or time.monotonic() - started < seconds:
        cells = _cells(next(batches), size)
        begun = time.perf_counter()
        write_one(cells)
        latencies_ms.append((time.perf_counter() - begun) * 1000)
        done += 1
    return done * size / (time.monotonic() - started)


SYSTEMS = ("raw", "raw_batched", "txn")
LABELS = {
    "raw": "Cassandra, prepared INSERTs",
    "raw_batched": "Cassandra, unlogged batches",
    "txn": "percolake transactions",
}


def write_figures(
    url: str,
    quick: bool,
    progress: Callable[[str], None],
    batches: Iterator[int],
    *,
    sizes: Sequence[int] = TXN_SIZES,
    runs: int | None = None,
) -> list[Result]:
    """Cells/s three ways at each transaction size in ``sizes``, in ``runs`` paired
    runs: each run times raw, raw batched and percolake back to back, so a ratio
    compares runs made under the same load, and its spread is that of the per-run
    ratios. More runs give a steadier median on a busy machine."""
    seconds = 0.75 if quick else 5.0
    runs = runs or (2 if quick else 3)
    results: list[Result] = []
    from bench.bench_cassandra_floor import figure_name, node_count

    store = open_store(url)
    assert isinstance(store, CassandraStore)
    nodes, name = node_count(store), figure_name(store)
    raw = RawWriter(store)
    tm = TransactionManager.embedded(url)

    def txn_write(cells: list[tuple[bytes, bytes]]) -> None:
        tx = tm.begin()
        for row, col in cells:
            tx.put("bench_cells", row, col, VALUE)
        tx.commit()

    writers = {"raw": raw.write, "raw_batched": raw.write_batched, "txn": txn_write}
    growth: dict[str, list[tuple[float, float]]] = {LABELS[s]: [] for s in SYSTEMS}
    latency: dict[str, list[float]] = {}
    anchors = {"raw": RAW_ANCHOR, "raw_batched": BATCHED_ANCHOR, "txn": RAW_ANCHOR}
    try:
        for size in sizes:
            progress(f"cassandra.write.cells{size}")
            # Warm every path (prepared statements, connections) before timing it.
            for write in writers.values():
                write(_cells(next(batches), size))
            rates: dict[str, list[float]] = {s: [] for s in SYSTEMS}
            samples: dict[str, list[float]] = {s: [] for s in SYSTEMS}
            for _ in range(runs):
                for system in SYSTEMS:
                    rates[system].append(
                        cells_per_second(writers[system], size, seconds, batches, samples[system])
                    )
            note = f"one client thread; {runs} paired runs of {seconds:g} s per system"
            for system in SYSTEMS:
                figure = summarize(
                    f"{name}.{system}.cells{size}.cells_per_s",
                    "cells/s",
                    anchors[system],
                    rates[system],
                    note,
                )
                results.append(figure)
                growth[LABELS[system]].append((size, figure.value))
            for label, anchor in (("raw", RATIO_ANCHOR), ("raw_batched", BATCHED_ANCHOR)):
                results.append(
                    summarize(
                        f"{name}.txn_vs_{label}.cells{size}.ratio",
                        "ratio",
                        anchor,
                        [t / b for t, b in zip(rates["txn"], rates[label], strict=True)],
                        note=f"percolake transaction cells/s / {label.replace('_', ' ')} "
                        f"cells/s, per paired run; {note}",
                    )
                )
            if size in (1, 100):
                for system in SYSTEMS:
                    latency[f"{LABELS[system]}, {size} cell{'s' if size > 1 else ''}"] = samples[
                        system
                    ]
    finally:
        tm.close()
        store.close()
    results.append(
        Growth(
            f"{name}.write.by_cells_per_txn",
            "Cassandra: write throughput by cells per transaction",
            "cells per transaction (or per raw request group)",
            "cells/s",
            growth,
            log_y=True,
            note=f"{nodes} node(s), one client thread; medians of paired runs",
        )
    )
    results.append(
        Latency.of(
            f"{name}.write.latency",
            "Cassandra: latency of one transaction / one raw write group",
            "ms",
            latency,
            note=f"every write of the timed runs, one client thread, {nodes} node(s)",
        )
    )
    return results


def scan_figures(url: str, quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    rows = 50_000 if quick else 1_000_000
    runs = 1 if quick else 2
    table = f"scan{rows}"
    store = open_store(url)
    assert isinstance(store, CassandraStore)
    raw = RawWriter(store)
    figures: list[Figure] = []
    try:
        progress(f"loading {rows:,} rows")
        started = time.monotonic()
        chunk = 20_000
        for first in range(0, rows, chunk):
            keys = [f"k{i:09d}".encode() for i in range(first, min(rows, first + chunk))]
            store.put_versions(table, [VersionWrite(k, b"c", 1, VALUE) for k in keys])
            raw.write([(b"s" + k, b"c") for k in keys])
        load_s = time.monotonic() - started
        figures.append(
            Figure(
                f"cassandra.load.rows{rows}.rows_per_s",
                round(2 * rows / load_s, 1),
                "rows/s",
                1,
                0.0,
                "put_versions and raw inserts, CONCURRENCY in flight",
                note="both tables loaded together; each row written once per table",
            )
        )

        def ordered() -> float:
            started = time.monotonic()
            count, previous = 0, b""
            for entry in store.scan(table, b"", None, MAX_TIMESTAMP, page_size=5000):
                if entry.row <= previous:
                    raise AssertionError(f"scan out of order at {entry.row!r}")
                previous = entry.row
                count += 1
            if count != rows:
                raise AssertionError(f"scan returned {count} rows, expected {rows}")
            return rows / (time.monotonic() - started)

        def unordered() -> float:
            started = time.monotonic()
            count = raw.scan_unordered()
            return count / (time.monotonic() - started)

        progress(f"cassandra.scan.rows{rows}")
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(runs):
            ours.append(ordered())
            theirs.append(unordered())
        scan = summarize(
            f"cassandra.scan.rows{rows}.rows_per_s",
            "rows/s",
            SCAN_ANCHOR,
            ours,
            note=f"KVStore.scan in key order, {store.shards} shards merged, page_size 5000",
        )
        raw_scan = summarize(
            f"cassandra.raw_scan.rows{rows}.rows_per_s",
            "rows/s",
            "token-order SELECT with driver paging (fetch_size 5000)",
            theirs,
        )
        figures += [
            scan,
            raw_scan,
            summarize(
                f"cassandra.scan_vs_raw.rows{rows}.ratio",
                "ratio",
                SCAN_ANCHOR,
                [a / b for a, b in zip(ours, theirs, strict=True)],
                note="ordered KVStore.scan rows/s / unordered raw SELECT rows/s, paired runs",
            ),
        ]
    finally:
        store.close()
    return figures


LIVE_AMONG_DEAD = 2
SWEEP_ANCHOR = "the same scan of a fresh table holding only the live cells, same cluster, same run"


def _keyspace_url(url: str, keyspace: str) -> str:
    base, _, query = url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + keyspace + (f"?{query}" if query else "")


#: How long the dead-cells figure lets Cassandra settle after the prune: two of the
#: index's one-minute flush periods (``INDEX_MEMTABLE_FLUSH_PERIOD_MS``); the tombstones
#: were gone within 42 s in the run that chose it (3 nodes).
SETTLE_S = 120
SETTLE_QUICK_S = 75


def _paired_scans(pruned: Any, fresh: Any, runs: int) -> tuple[list[float], list[float]]:
    """``runs`` scans of each store, alternating so that both see the same load."""
    after: list[float] = []
    only: list[float] = []
    for _ in range(runs):
        after.append(_scan_ms(pruned, LIVE_AMONG_DEAD))
        only.append(_scan_ms(fresh, LIVE_AMONG_DEAD))
    return after, only


def _trickle(store: Any, seconds: float) -> None:
    """One new cell a second in another table of ``store``'s keyspace for ``seconds``:
    a cluster in use, whose index memtables flush and whose compactions run."""
    deadline = time.monotonic() + seconds
    written = 0
    while time.monotonic() < deadline:
        written += 1
        store.put_versions("trickle", [VersionWrite(b"r%d" % written, b"c", 100, VALUE)])
        time.sleep(1)


def _scan_ms(store: Any, expected: int) -> float:
    started = time.perf_counter()
    got = sum(1 for _ in store.scan("t", b"", None, MAX_TIMESTAMP, page_size=1000))
    if got != expected:
        raise AssertionError(f"scan returned {got} cells, expected {expected}")
    return (time.perf_counter() - started) * 1000


#: Rows a setup step writes or deletes at once: three nodes on two cores, each holding
#: every row (replication factor 3), timed out QUORUM reads under 20,000 at a time.
SETUP_CHUNK = 5_000


@tenacity.retry(
    retry=tenacity.retry_if_exception_type((StoreTimeoutError, StoreUnavailableError)),
    stop=tenacity.stop_after_attempt(5),
    wait=tenacity.wait_exponential(multiplier=1, max=20),
    before_sleep=tenacity.before_sleep_log(log, logging.WARNING),
    reraise=True,
)
def _setup_step(step: Callable[..., Any], *args: Any) -> Any:
    """One idempotent write or delete of a figure's setup, again after a store timeout
    (a busy cluster compacting the setup's own writes): the figure times what follows,
    not the setup."""
    return step(*args)


def dead_cells_figures(url: str, quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    """Scans among cleaned cells after the prune, against a table of the live ones only."""
    dead = 10_000 if quick else 100_000
    runs = 5 if quick else 9
    prefix = f"cassandra.scan.after_dead_cells{dead}"
    pruned = open_store(_keyspace_url(url, f"bench_dead_{dead}"))
    fresh = open_store(_keyspace_url(url, f"bench_live_{dead}"))
    try:
        live = [(f"k{i * (dead // LIVE_AMONG_DEAD):09d}".encode(), b"c") for i in range(2)]
        for store in (pruned, fresh):
            store.put_versions("t", [VersionWrite(r, c, 1, VALUE) for r, c in live])
        progress(f"{prefix}: writing and cleaning")
        for first in range(0, dead, SETUP_CHUNK):
            doomed = [
                (f"k{i:09d}x".encode(), b"c", 10)
                for i in range(first, min(dead, first + SETUP_CHUNK))
            ]
            _setup_step(
                pruned.put_versions, "t", [VersionWrite(r, c, ts, VALUE) for r, c, ts in doomed]
            )
            _setup_step(pruned.delete_versions, "t", doomed)
        before = _scan_ms(pruned, LIVE_AMONG_DEAD)
        progress(f"{prefix}: prune")
        started = time.perf_counter()
        count = pruned.prune_cells("t", 11)
        prune_s = time.perf_counter() - started
        if count != dead:
            raise AssertionError(f"pruned {count} cells, expected {dead}")
        progress(f"{prefix}: scans right after the prune")
        right_after, _ = _paired_scans(pruned, fresh, runs)
        settle_s = SETTLE_QUICK_S if quick else SETTLE_S
        progress(f"{prefix}: {settle_s} s of other writes, then scans")
        _trickle(pruned, settle_s)
        after, only = _paired_scans(pruned, fresh, runs)
        what = f"full scans of {LIVE_AMONG_DEAD} live cells among {dead:,} cleaned ones"
        settled = (
            f"{settle_s} s after prune_cells, while one cell a second was written to "
            "another table of the keyspace (the index's tombstones flushed and compacted "
            "away by Cassandra itself: gc_grace 0 and a one-minute flush period)"
        )

        def vs_live_only(name: str, scans: list[float], when: str) -> Figure:
            ratios = [a / b for a, b in zip(scans, only, strict=True)]
            note = f"{what}{when} / the same scan of a fresh table, paired runs"
            return summarize(name, "ratio", SWEEP_ANCHOR, ratios, note=note)

        return [
            vs_live_only(
                f"{prefix}.vs_live_only.ratio",
                after,
                f", {settled}; goal <= 2 (issue 27: 31-50 s on 3 nodes before the prune)",
            ),
            vs_live_only(
                f"{prefix}.right_after_prune.vs_live_only.ratio",
                right_after,
                " as soon as prune_cells returned (the shadowed index rows still in memtables)",
            ),
            summarize(f"{prefix}.after_prune.ms", "ms", SWEEP_ANCHOR, after, note=settled),
            summarize(f"{prefix}.live_only.ms", "ms", "none: the reference", only),
            Figure(
                f"{prefix}.before_prune.ms",
                round(before, 1),
                "ms",
                1,
                0.0,
                f"{prefix}.after_prune.ms",
                note=f"{what}, every cleaned cell still in the index (before issue 27)",
            ),
            Figure(
                f"{prefix}.prune.seconds",
                round(prune_s, 2),
                "s",
                1,
                0.0,
                "none: the prune's own wall time",
                note=f"prune_cells over {dead:,} dead cells among {LIVE_AMONG_DEAD} live "
                "ones, 32 shards",
            ),
        ]
    finally:
        pruned.close()
        fresh.close()


class _Oracle:
    """Timestamps above every version the GC figure writes."""

    def __init__(self, first: int) -> None:
        self._next = first

    def next_timestamp(self) -> int:
        self._next += 1
        return self._next


def gc_cell_figures(url: str, quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    """One pass over a cell of 25,000 committed versions; the deletes alone both ways."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.bench_cassandra_gc_floor import raw_floor_seconds
    from txn import GarbageCollector
    from txn.tables import GC_TABLE, STATE_KEY, TXN_TABLE, GcState, encode_outcome, txn_key

    versions = 2_500 if quick else 25_000
    prefix = f"cassandra.gc.cell_versions{versions}"
    store = open_store(_keyspace_url(url, f"bench_gc_cell_{versions}"))
    try:
        progress(f"{prefix}: writing {versions:,} versions and their entries")
        starts = [2 * i + 2 for i in range(versions)]
        for name in (b"pass", b"rows", b"ranges"):
            for first in range(0, versions, SETUP_CHUNK):
                _setup_step(
                    store.put_versions,
                    "t",
                    [VersionWrite(name, b"c", ts, VALUE) for ts in starts[first:][:SETUP_CHUNK]],
                )

        def commit(ts: int) -> None:
            # Re-issued after an unknown outcome: the same value found means it landed.
            _setup_step(store.put_unless_exists, TXN_TABLE, txn_key(ts), encode_outcome(ts + 1))

        with ThreadPoolExecutor(32) as pool:
            list(pool.map(commit, starts))
        store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
        progress(f"{prefix}: deletes alone, both ways")
        doomed = [(b"rows", b"c", ts) for ts in starts[:-1]]
        started = time.perf_counter()
        store.delete_versions("t", doomed)
        rows_s = time.perf_counter() - started
        started = time.perf_counter()
        store.delete_version_ranges("t", [(b"ranges", b"c", starts[0], starts[-2])])
        ranges_s = time.perf_counter() - started
        progress(f"{prefix}: one pass")
        collector = GarbageCollector(
            store, timestamps=_Oracle(2 * versions + 10), retention_s=0, grace_ms=0
        )
        report = collector.run_once()
        if report.versions_deleted < versions - 1:
            raise AssertionError(f"the pass deleted too little: {report.summary()}")
        assert isinstance(store, CassandraStore)
        floor_s = raw_floor_seconds(store, versions, progress)
        what = f"one cell of {versions:,} committed versions"
        return [
            Figure(
                f"{prefix}.raw_floor.seconds",
                round(floor_s, 2),
                "s",
                1,
                0.0,
                "none: the floor",
                note=f"raw driver, plain tables, same cluster, right after the pass: one "
                f"range delete of {versions - 1:,} versions of one cell and {versions:,} "
                "entry deletes by key (execute_concurrent_with_args), no reads",
            ),
            Figure(
                f"{prefix}.pass.vs_raw_floor.ratio",
                round(floor_s / report.seconds, 3),
                "ratio",
                1,
                0.0,
                f"{prefix}.raw_floor.seconds",
                note="raw floor seconds / pass seconds (1.0: the pass costs what its "
                "deletes alone cost the raw driver)",
            ),
            Figure(
                f"{prefix}.pass.seconds",
                round(report.seconds, 2),
                "s",
                1,
                0.0,
                "issue 27: 549 s for a pass over a cell of 25,000 versions (one node, "
                "one delete per version, the gc.long_history figure)",
                note=f"{what}; GarbageCollector.run_once at retention 0, grace 0: "
                f"{report.summary()} (the pass also swept the two cells below, already "
                "emptied)",
            ),
            Figure(
                f"{prefix}.delete_versions.seconds",
                round(rows_s, 2),
                "s",
                1,
                0.0,
                "none: the per-version way",
                note=f"delete_versions of {versions - 1:,} versions of one cell: a "
                "write-time read per 100 and a row tombstone each",
            ),
            Figure(
                f"{prefix}.delete_version_ranges.seconds",
                round(ranges_s, 3),
                "s",
                1,
                0.0,
                f"{prefix}.delete_versions.seconds",
                note=f"delete_version_ranges of the same {versions - 1:,} versions of "
                "another cell: one aggregate read and one range tombstone",
            ),
        ]
    finally:
        store.close()


def commit_figures(
    url: str,
    quick: bool,
    progress: Callable[[str], None],
    *,
    sizes: Sequence[int] = TXN_SIZES,
    runs: int | None = None,
) -> list[Result]:
    """The commit figures (``--only-commit`` runs just these): transactions against raw
    writes, and a lakehouse group commit against its floor
    (:mod:`bench.bench_cassandra_floor`), on the same cluster; ``runs``: paired runs of
    each (default: each one's own)."""
    from bench.bench_cassandra_cpu import cpu_figures
    from bench.bench_cassandra_floor import group_commit_figures

    load = MachineLoad()
    results = write_figures(url, quick, progress, itertools.count(), sizes=sizes, runs=runs)
    results += group_commit_figures(url, quick, progress, runs=runs)
    if 100 in sizes:
        results += cpu_figures(url, progress, runs=30 if quick else 150)
    return load.stamp(results, _topology(url))


def _store_topology(url: str) -> str:
    """The cluster the figures ran on."""
    from bench.bench_cassandra_floor import node_count

    store = open_store(url)
    try:
        assert isinstance(store, CassandraStore)
        nodes, rf = node_count(store), store.settings.replication_factor
    finally:
        store.close()
    return f"Cassandra {nodes} node(s) on 127.0.0.x, replication factor {rf}, on this machine"


def _topology(url: str) -> str:
    """Where the commit figures ran: the cluster, and the client in the bench process."""
    return (
        f"{_store_topology(url)}; the client is the bench process itself (embedded "
        "TransactionManager and Catalog, no percolake serve), as the raw driver it is "
        "compared with"
    )


def sweep_figures(url: str, quick: bool, progress: Callable[[str], None]) -> list[Result]:
    """The figures of issue 27's store side (``--only-sweep`` runs just these), each
    note naming the cluster and the machine's load."""
    load = MachineLoad()
    results: list[Result] = [*dead_cells_figures(url, quick, progress)]
    results += gc_cell_figures(url, quick, progress)
    return load.stamp(results, _store_topology(url))


def run(
    quick: bool, progress: Callable[[str], None] = lambda _: None, url: str | None = None
) -> list[Result]:
    """The suite entry point of ``python -m bench``: starts its own node without ``url``."""
    from bench import bench_cassandra_history

    with cassandra_url(url) as store_url:
        results = commit_figures(store_url, quick, progress)
        results += scan_figures(store_url, quick, progress)
        results += sweep_figures(store_url, quick, progress)
        # Reads after clean-up and on long histories (issue 18), on the same node.
        results += bench_cassandra_history.run(quick, progress, url=store_url)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cassandra", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, 50k-row scan")
    parser.add_argument("--url", help="cassandra:// URL of a running cluster (default: start one)")
    parser.add_argument(
        "--only-sweep", action="store_true", help="only the sweeping figures (issue 27)"
    )
    parser.add_argument(
        "--only-commit",
        action="store_true",
        help="only the commit figures: txn vs raw writes, group commit vs floor (issue 27)",
    )
    parser.add_argument(
        "--size",
        type=int,
        action="append",
        choices=TXN_SIZES,
        help="with --only-commit: only this transaction size (repeatable; default all)",
    )
    parser.add_argument(
        "--runs", type=int, help="with --only-commit: paired runs of each commit figure"
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="merge the figures into bench/results/latest.json (with --size, the figures "
        "only: the narrowed curves would replace a full run's)",
    )
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if (args.size or args.runs) and not args.only_commit:
        parser.error("--size and --runs go with --only-commit")
    logging.basicConfig(level=logging.WARNING)
    from bench.__main__ import print_result

    def progress(step: str) -> None:
        print(f"   {step} ...", flush=True)

    if args.only_sweep or args.only_commit:
        with cassandra_url(args.url) as store_url:
            results: list[Result] = []
            if args.only_commit:
                results += commit_figures(
                    store_url,
                    args.quick,
                    progress,
                    sizes=tuple(args.size or TXN_SIZES),
                    runs=args.runs,
                )
            if args.only_sweep:
                results += sweep_figures(store_url, args.quick, progress)
    else:
        results = run(args.quick, progress=progress, url=args.url)
    for result in results:
        print_result(result)
    if args.write:
        from bench._results import write_for_command

        kept = [r for r in results if isinstance(r, Figure)] if args.size else results
        print(f"written to {write_for_command(kept, quick=args.quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
