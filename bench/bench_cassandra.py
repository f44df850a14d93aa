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

Scans: one logical table of 1,000,000 cells (100,000 with ``--quick``) listed in key
order through ``KVStore.scan`` (a k-way merge over the table's shards), against a
plain token-order ``SELECT`` of the same rows from the raw table.

Without ``--url`` a one-node Cassandra is started in a temporary directory (jars from
the cache, fetched on first use) and stopped afterwards. Results go to
``bench/results/cassandra.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench._results import Figure, measure, write_results
from storage_adapters import MAX_TIMESTAMP, VersionWrite, open_store
from storage_adapters.cassandra import CONCURRENCY, CassandraStore, _batched, shard_of
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
    from percolake.cassandra import CassandraCluster

    with tempfile.TemporaryDirectory(prefix="percolake-bench-") as tmp:
        native, storage, jmx = _free_ports(3)
        cluster = CassandraCluster(
            nodes=1,
            base_dir=Path(tmp),
            cluster_name="percolake-bench",
            native_transport_port=native,
            storage_port=storage,
            jmx_port=jmx,
        )
        with cluster:
            yield cluster.store_url("percolake_bench")


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.add(sock.getsockname()[1])
    return sorted(ports)


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
        queries = _batched(self.insert_sharded, items)
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
) -> float:
    """Write batches of ``size`` cells for about ``seconds`` (at least twice)."""
    done = 0
    started = time.monotonic()
    while done < 2 or time.monotonic() - started < seconds:
        write_one(_cells(next(batches), size))
        done += 1
    return done * size / (time.monotonic() - started)


def write_figures(
    url: str, quick: bool, progress: Callable[[str], None], batches: Iterator[int]
) -> list[Figure]:
    seconds = 1.5 if quick else 5.0
    runs = 2 if quick else 3
    figures: list[Figure] = []
    store = open_store(url)
    assert isinstance(store, CassandraStore)
    raw = RawWriter(store)
    tm = TransactionManager.embedded(url)

    def txn_write(cells: list[tuple[bytes, bytes]]) -> None:
        tx = tm.begin()
        for row, col in cells:
            tx.put("bench_cells", row, col, VALUE)
        tx.commit()

    def rate(write: Callable[[list[tuple[bytes, bytes]]], None], size: int) -> Callable[[], float]:
        return lambda: cells_per_second(write, size, seconds, batches)

    try:
        for size in TXN_SIZES:
            # Warm every path (prepared statements, JIT, connections) before timing it.
            for write in (raw.write, raw.write_batched, txn_write):
                write(_cells(next(batches), size))
            progress(f"cassandra.raw.cells{size}")
            raw_figure = measure(
                f"cassandra.raw.cells{size}.cells_per_s",
                "cells/s",
                RAW_ANCHOR,
                runs,
                rate(raw.write, size),
            )
            progress(f"cassandra.raw_batched.cells{size}")
            batched_figure = measure(
                f"cassandra.raw_batched.cells{size}.cells_per_s",
                "cells/s",
                BATCHED_ANCHOR,
                runs,
                rate(raw.write_batched, size),
            )
            progress(f"cassandra.txn.cells{size}")
            txn_figure = measure(
                f"cassandra.txn.cells{size}.cells_per_s",
                "cells/s",
                RAW_ANCHOR,
                runs,
                rate(txn_write, size),
                note=f"one transaction of {size} puts, committed; one client thread",
            )
            figures += [raw_figure, batched_figure, txn_figure]
            for baseline, label, anchor in (
                (raw_figure, "raw", RATIO_ANCHOR),
                (batched_figure, "raw_batched", BATCHED_ANCHOR),
            ):
                figures.append(
                    Figure(
                        f"cassandra.txn_vs_{label}.cells{size}.ratio",
                        round(txn_figure.value / baseline.value, 3),
                        "ratio",
                        runs,
                        round(txn_figure.spread + baseline.spread, 3),
                        anchor,
                        note=f"percolake transactions / {label.replace('_', ' ')} writes, cells/s",
                    )
                )
    finally:
        tm.close()
        store.close()
    return figures


def scan_figures(url: str, quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    rows = 100_000 if quick else 1_000_000
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
        scan = measure(
            f"cassandra.scan.rows{rows}.rows_per_s",
            "rows/s",
            SCAN_ANCHOR,
            runs,
            ordered,
            note=f"KVStore.scan in key order, {store.shards} shards merged, page_size 5000",
        )
        progress(f"cassandra.raw_scan.rows{rows}")
        raw_scan = measure(
            f"cassandra.raw_scan.rows{rows}.rows_per_s",
            "rows/s",
            "token-order SELECT with driver paging (fetch_size 5000)",
            runs,
            unordered,
        )
        figures += [
            scan,
            raw_scan,
            Figure(
                f"cassandra.scan_vs_raw.rows{rows}.ratio",
                round(scan.value / raw_scan.value, 3),
                "ratio",
                runs,
                round(scan.spread + raw_scan.spread, 3),
                SCAN_ANCHOR,
                note="ordered KVStore.scan rows/s / unordered raw SELECT rows/s",
            ),
        ]
    finally:
        store.close()
    return figures


def run(
    quick: bool, progress: Callable[[str], None] = lambda _: None, url: str | None = None
) -> list[Figure]:
    """The suite entry point of ``python -m bench``; also writes ``results/cassandra.json``."""
    batches = itertools.count()
    with cassandra_url(url) as store_url:
        figures = write_figures(store_url, quick, progress, batches)
        figures += scan_figures(store_url, quick, progress)
    path = write_results(figures, name="cassandra")
    log.info("wrote %s", path)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cassandra", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, 100k-row scan")
    parser.add_argument("--url", help="cassandra:// URL of a running cluster (default: start one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    figures = run(args.quick, progress=lambda n: print(f"   {n} ...", flush=True), url=args.url)
    for f in figures:
        print(f"   {f.name:48s} {f.value:>14,.3f} {f.unit} (runs {f.runs}, spread {f.spread:.0%})")
    print("wrote bench/results/cassandra.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
