"""Time ``percolake check`` on 100k-transaction list-append histories.

Histories come from ``percolake.tools.checker.synthetic``: concurrent clients over a
multi-version store with percolake's rules. Timed end to end like the CLI (read and
parse the file, infer, search cycles):

- a valid snapshot-isolation history, checked under snapshot isolation (valid; its write
  skew is reported as allowed) and under serializable (G2-item found);
- the same workload with injected bugs (skipped write-write conflict checks, stale
  snapshots): lost updates, G-single, G-nonadjacent, timestamp-order, ...;
- an adversarial ring: one G-single cycle through every transaction, so the whole
  history is a single strongly connected component.

Also how the check time grows with the history's length (valid history, snapshot
isolation): 1,000 and 10,000 transactions, plus the main size.

Run: ``.venv/bin/python -m bench --only bench.bench_checker [--quick]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench._results import Figure, Growth, Result, measure
from percolake.tools.checker import Report, check_file
from percolake.tools.checker.synthetic import Workload, simulate, write_history

ANCHOR = (
    "target: 100k transactions well under 30 s on 2 cores; Elle (Kingsbury and Alvaro, "
    "VLDB 2020) is ~linear in history length"
)


def _workload(txns: int, **bugs: float) -> Workload:
    return Workload(
        txns=txns,
        processes=20,
        active_keys=20,
        max_writes_per_key=32,
        min_txn_length=1,
        max_txn_length=4,
        abort_fraction=0.01,
        info_fraction=0.01,
        seed=42,
        **bugs,  # type: ignore[arg-type]
    )


def _ring(txns: int) -> list[dict[str, object]]:
    """T_i appends k_i and reads T_{i-1}'s append; the last misses T_0's: one G-single."""
    ops: list[dict[str, object]] = []
    for i in range(txns):
        mops: list[list[object]] = [["append", f"k{i}", 1]]
        if i:
            mops.append(["r", f"k{i - 1}", [1]])
        if i == txns - 1:
            mops.append(["r", "k0", []])
        invoke = [[f, k, None if f == "r" else v] for f, k, v in mops]
        ops.append({"index": 2 * i, "type": "invoke", "process": i, "f": "txn", "value": invoke})
        ops.append({"index": 2 * i + 1, "type": "ok", "process": i, "f": "txn", "value": mops})
    return ops


def _timed(path: Path, model: str, sink: list[Report]) -> Callable[[], float]:
    def once() -> float:
        started = time.perf_counter()
        sink.append(check_file(path, model))
        return time.perf_counter() - started

    return once


def _summary(report: Report) -> str:
    stats = report.stats
    found = dict(report.anomaly_counts) or "none"
    allowed = dict(report.allowed_counts) or "none"
    return (
        f"valid={report.valid}; anomalies {found}; allowed {allowed}; txns {stats['txns']}; "
        f"largest SCC {stats['largest_scc']}; parse {stats.get('parse_seconds')} s, infer "
        f"{stats['infer_seconds']} s, cycles {stats['cycle_search_seconds']} s"
    )


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    txns = 10_000 if quick else 100_000
    runs = 1 if quick else 3
    size = f"txns{txns}"
    figures: list[Result] = []
    growth: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        histories = {
            "valid": Path(tmp) / "valid.jsonl",
            "anomalies": Path(tmp) / "anomalies.jsonl",
            "ring": Path(tmp) / "ring.jsonl",
        }
        progress(f"generating {txns}-transaction histories")
        write_history(simulate(_workload(txns)), histories["valid"])
        buggy = _workload(txns, lost_update_bug_fraction=0.2, stale_read_bug_fraction=0.002)
        write_history(simulate(buggy), histories["anomalies"])
        write_history(_ring(txns), histories["ring"])

        cases = [
            ("valid", "snapshot-isolation", "valid SI history, checked under snapshot-isolation"),
            ("valid", "serializable", "valid SI history, checked under serializable"),
            ("anomalies", "snapshot-isolation", "SI history with injected bugs"),
            ("ring", "snapshot-isolation", "one G-single cycle through every transaction"),
        ]
        for history, model, what in cases:
            name = f"checker.list_append.{size}.{history}.{model.replace('-', '_')}.seconds"
            progress(name)
            reports: list[Report] = []
            figure = measure(name, "s", ANCHOR, runs, _timed(histories[history], model, reports))
            report = reports[-1]
            if history == "valid" and model == "snapshot-isolation":
                assert report.valid, report.render_text()
            figures.append(
                Figure(
                    figure.name,
                    figure.value,
                    figure.unit,
                    figure.runs,
                    figure.spread,
                    figure.anchor,
                    f"{what}: {_summary(report)}",
                )
            )
            if history == "valid" and model == "snapshot-isolation":
                growth.append((txns, figure.value))
        for smaller in (1_000, 10_000):
            if smaller >= txns:
                continue
            progress(f"checker growth: {smaller} transactions")
            path = Path(tmp) / f"valid-{smaller}.jsonl"
            write_history(simulate(_workload(smaller)), path)
            sink: list[Report] = []
            growth.append(
                (
                    smaller,
                    measure(
                        "growth", "s", ANCHOR, 1, _timed(path, "snapshot-isolation", sink)
                    ).value,
                )
            )
    figures.append(
        Growth(
            "checker.by_transactions",
            "History checker: time by history length",
            "transactions in the history",
            "seconds",
            {"valid SI history, checked under snapshot-isolation": sorted(growth)},
            log_y=True,
            note="end to end like `percolake check`: parse, infer, search cycles; one run per size",
        )
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k transactions, one run")
    args = parser.parse_args()
    from bench.__main__ import print_result

    for result in run(args.quick, progress=lambda n: print("running", n, flush=True)):
        print_result(result)


if __name__ == "__main__":
    main()
