"""Commit throughput of the transaction protocol on the embedded stores.

Commits per second on memory and sqlite with 1, 10, 100 and 1,000 cells per
transaction and one thread, and with 1 and 100 cells and eight threads; every
transaction writes rows of its own, so nothing conflicts. The one-thread runs also
record each commit's latency, for the latency plot.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from collections.abc import Callable

from bench._load import run_threads
from bench._results import Growth, Latency, Result, summarize
from txn import Manager, TransactionManager

ANCHOR = (
    "Percolator (OSDI'10): transactional writes at 23% of raw Bigtable throughput; "
    "compare cassandra.txn_vs_raw.* for a same-run raw baseline"
)
CELLS = (1, 10, 100, 1000)
THREADS = (1, 8)


def commits_per_second(
    tm: Manager,
    cells: int,
    threads: int,
    seconds: float,
    latencies_ms: list[float] | None = None,
) -> float:
    """Commits/s of ``threads`` threads writing ``cells`` fresh cells per transaction;
    with ``latencies_ms``, each transaction's wall time is added to it. Nothing
    conflicts, so any failed commit is a bug and raises."""

    def commit(n: int) -> None:
        with tm.begin() as tx:
            for c in range(cells):
                tx.put("bench", f"r{n:09d}-{c:04d}".encode(), b"v", b"x" * 16)

    run = run_threads(commit, threads, seconds)
    if run.failed:
        raise RuntimeError(f"{run.failed} conflict-free commits failed (see the debug log)")
    if latencies_ms is not None:
        latencies_ms.extend(run.latencies_ms)
    return run.rate


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    seconds = 0.5 if quick else 4.0
    runs = 2 if quick else 3
    results: list[Result] = []
    growth: dict[str, list[tuple[float, float]]] = {}
    latency: dict[str, list[float]] = {}
    counter = itertools.count()
    with tempfile.TemporaryDirectory() as tmp:
        for store in ("memory", "sqlite"):
            for cells in CELLS:
                for threads in THREADS:
                    if threads > 1 and cells not in (1, 100):
                        continue
                    name = f"txn.{store}.cells{cells}.threads{threads}.commits_per_s"
                    progress(name)
                    samples: list[float] = []
                    rates = []
                    for _ in range(runs):
                        url = (
                            "memory://"
                            if store == "memory"
                            else f"sqlite:///{tmp}/bench-{next(counter)}.db"
                        )
                        with TransactionManager.embedded(url) as tm:
                            rates.append(commits_per_second(tm, cells, threads, seconds, samples))
                    note = f"{runs} runs of {seconds:g} s, fresh store each run"
                    figure = summarize(name, "commits/s", ANCHOR, rates, note)
                    results.append(figure)
                    if threads == 1:
                        ms_per_commit = 1000 / figure.value
                        growth.setdefault(store, []).append((cells, ms_per_commit))
                        if cells in (1, 100):
                            latency[f"{store}, {cells} cell{'s' if cells > 1 else ''}"] = samples
    results.append(
        Growth(
            "txn.commit.by_cells_per_txn",
            "Embedded commits: time per transaction by cells written",
            "cells per transaction",
            "ms per commit (1 / median commits/s, one thread)",
            growth,
            log_y=True,
            note="TransactionManager.embedded, one thread, no conflicts",
        )
    )
    results.append(
        Latency.of(
            "txn.commit.latency",
            "Embedded commit latency, one thread",
            "ms",
            latency,
            note="begin + puts + commit of every transaction in the one-thread runs",
        )
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from bench.__main__ import print_result

    for result in run(args.quick, progress=lambda n: print("running", n, flush=True)):
        print_result(result)


if __name__ == "__main__":
    main()
