"""``make bench``: run every benchmark in this process tree and write the results.

Each suite runs in its own fresh process (:func:`bench._load.run_suite`), one after
another: PySpark keeps
one JVM per Python process, and what a JVM was started with (its environment, such as
the S3 suite's MinIO credentials, which s3a's credential chain and Spark's Python
workers read; ``spark.driver.memory``) is fixed for every later session in that
process. In one shared process the first Spark suite's JVM served them all: the S3
suite's s3a writes had no credentials, and the MERGE suite's 3 GB heap was 2 GB.

Full mode writes ``bench/results/latest.json`` (the contract's figures, plus a dated
copy), ``latest-series.json`` (the curves and distributions behind the plots), the
PNG plots, docs/benchmarks.md and the README's summary. ``--quick`` (about four
minutes) writes the same files under ``bench/results/quick/`` and leaves the README
and docs/benchmarks.md alone, so a quick run never replaces the full report. The
Cassandra suite starts its own node.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from bench._load import run_suite
from bench._results import (
    QUICK_DIR,
    RESULTS_DIR,
    Figure,
    Growth,
    Result,
    write_for_command,
    write_results,
)

log = logging.getLogger("bench")

#: Benchmark modules, each with ``run(quick, progress) -> list[Result]``.
SUITES = [
    "bench.bench_txn",
    "bench.bench_grpc",
    "bench.bench_cassandra",
    "bench.bench_lakehouse",
    "bench.bench_lakehouse_deployed",
    "bench.bench_lakehouse_s3",
    "bench.bench_ha",
    "bench.bench_restart",
    "bench.bench_hotkeys",
    "bench.bench_gc",
    "bench.bench_datasource",
    "bench.bench_lakehouse_merge",
    "bench.bench_checker",
]


def describe(result: Result) -> str:
    """One line for the console."""
    if isinstance(result, Figure):
        return (
            f"{result.name:60s} {result.value:>14,.3f} {result.unit} "
            f"(runs {result.runs}, spread {result.spread:.0%})"
        )
    if isinstance(result, Growth):
        lines = ", ".join(
            f"{label}: {len(points)} points" for label, points in result.lines.items()
        )
        return f"{result.name:60s} growth of {result.y_label} by {result.x_label} ({lines})"
    parts = ", ".join(
        f"{label}: p50 {d['p50']:.2f} p99 {d['p99']:.2f} {result.unit} (n={d['count']:.0f})"
        for label, d in result.distributions.items()
    )
    return f"{result.name:60s} latency {parts}"


def finish_command(results: Sequence[Result], *, started: float, write: bool, quick: bool) -> int:
    """The end of a suite run as its own command: each figure on a line, the time taken,
    and with ``--write`` the results merged into ``bench/results``."""
    for result in results:
        print(describe(result), flush=True)
    print(f"took {time.monotonic() - started:.0f} s")
    if write:
        print(f"wrote {write_for_command(results, quick=quick)}")
    return 0


def print_result(result: Result) -> None:
    print(f"   {describe(result)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (about four minutes)")
    parser.add_argument(
        "--only", action="append", choices=SUITES, help="run only this suite (repeatable)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"results directory (default {RESULTS_DIR}, or {QUICK_DIR} with --quick)",
    )
    parser.add_argument(
        "--no-readme",
        action="store_true",
        help="do not rewrite docs/benchmarks.md and the README's summary",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out: Path = args.out or (QUICK_DIR if args.quick else RESULTS_DIR)
    suites: list[str] = args.only or SUITES
    results: list[Result] = []
    started = time.monotonic()
    with tqdm(total=len(suites), unit="suite", dynamic_ncols=True, file=sys.stderr) as bar:
        for name in suites:
            bar.set_description(name.removeprefix("bench."))

            def progress(step: str, bar: tqdm = bar) -> None:
                bar.set_postfix_str(step, refresh=True)

            suite_started = time.monotonic()
            got = run_suite(name, args.quick, progress)
            bar.write(f"== {name} ({time.monotonic() - suite_started:.0f} s)")
            for result in got:
                bar.write(f"   {describe(result)}")
            results.extend(got)
            bar.update(1)
    mode = "quick" if args.quick else "full"
    # A full run of every suite replaces the files; --only merges into them.
    path = write_results(results, out, mode=mode, merge=args.only is not None)
    print(f"wrote {path} ({mode} mode, {time.monotonic() - started:.0f} s)")
    from bench.report import plot, write_reports

    for png in plot(path):
        print(f"wrote {png}")
    if out == RESULTS_DIR and not args.no_readme and not args.quick:
        for report in write_reports(path):
            print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
