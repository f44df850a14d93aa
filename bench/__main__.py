"""``make bench``: run every benchmark and write bench/results/latest.json."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from bench._results import Figure, write_results

#: Benchmark modules, each with ``run(quick, progress) -> list[Figure]``.
SUITES = [
    "bench.bench_txn",
    "bench.bench_grpc",
    "bench.bench_cassandra",
    "bench.bench_lakehouse",
    "bench.bench_checker",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (under two minutes)")
    parser.add_argument("--only", action="append", help="run only these suites (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    figures: list[Figure] = []
    for name in args.only or SUITES:
        module = importlib.import_module(name)
        print(f"== {name}", flush=True)
        got = module.run(args.quick, progress=lambda n: print(f"   {n} ...", flush=True))
        for f in got:
            print(
                f"   {f.name:58s} {f.value:>12,.1f} {f.unit} (runs {f.runs}, spread {f.spread:.0%})"
            )
        figures.extend(got)
    path = write_results(figures)
    print(f"wrote {path}")
    from bench.report import plot, update_readme

    update_readme(path)
    for png in plot(path):
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
