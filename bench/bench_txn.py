"""Commit throughput of the transaction protocol on the embedded stores.

Single-cell and 100-cell commits per second on memory and sqlite, with one and
eight threads; every transaction writes rows of its own, so nothing conflicts.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import threading
import time
from collections.abc import Callable

from bench._results import Figure, measure
from txn import TransactionManager

ANCHOR = (
    "Percolator (OSDI'10): transactional writes at 23% of raw Bigtable throughput; "
    "compare cassandra.txn_vs_raw.* for a same-run raw baseline"
)


def commits_per_second(tm: TransactionManager, cells: int, threads: int, seconds: float) -> float:
    counter = itertools.count()
    done = [0] * threads
    stop = time.monotonic() + seconds

    def worker(slot: int) -> None:
        while time.monotonic() < stop:
            n = next(counter)
            with tm.begin() as tx:
                for c in range(cells):
                    tx.put("bench", f"r{n:09d}-{c:04d}".encode(), b"v", b"x" * 16)
            done[slot] += 1

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(done) / (time.monotonic() - started)


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Figure]:
    seconds = 1.0 if quick else 4.0
    runs = 2 if quick else 3
    figures = []
    counter = itertools.count()
    with tempfile.TemporaryDirectory() as tmp:
        for store in ("memory", "sqlite"):
            for cells in (1, 100):
                for threads in (1, 8):
                    name = f"txn.{store}.cells{cells}.threads{threads}.commits_per_s"
                    progress(name)

                    def once(
                        store: str = store, cells: int = cells, threads: int = threads
                    ) -> float:
                        url = (
                            "memory://"
                            if store == "memory"
                            else f"sqlite:///{tmp}/bench-{next(counter)}.db"
                        )
                        with TransactionManager.embedded(url) as tm:
                            return commits_per_second(tm, cells, threads, seconds)

                    figures.append(measure(name, "commits/s", ANCHOR, runs, once))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for figure in run(args.quick, progress=lambda n: print("running", n, flush=True)):
        print(
            f"{figure.name:55s} {figure.value:>10.1f} {figure.unit}  (spread {figure.spread:.0%})"
        )


if __name__ == "__main__":
    main()
