"""``percolake chaos suite``: the long runs behind ``make chaos``.

Every workload on a three-node Cassandra with partitions, kills, pauses and a slow
network, plus faster runs on the embedded store that add volume, and the lakehouse on
an S3 warehouse (the run's own MinIO, paused and killed -9): over half an hour
and well over 100,000 transactions in all at ``--scale 1``. Each run leaves its report,
plot, schedule and (gzipped) history in ``OUT/<name>/``; scratch data (Cassandra's,
SQLite's, client logs) goes to ``--work-dir`` and is removed after a clean run.
``OUT/summary.json`` and ``OUT/SUMMARY.md`` add the runs up.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from percolake.tools.chaos._config import (
    NEMESES,
    REPLICA_NEMESES,
    S3_NEMESES,
    SQLITE_ORACLE_NEMESES,
    RunConfig,
)

log = logging.getLogger("percolake.tools.chaos")

#: Every fault a Cassandra run without replicas takes; SQLite runs add the oracle
#: overlap. The leader faults need ``--replicas``, the S3 faults ``--warehouse s3``.
ALL_FAULTS: Final = tuple(
    n
    for n in NEMESES
    if n not in SQLITE_ORACLE_NEMESES and n not in REPLICA_NEMESES and n not in S3_NEMESES
)
SQLITE_FAULTS: Final = tuple(n for n in NEMESES if n not in REPLICA_NEMESES | S3_NEMESES)
NO_SLOW: Final = ("kill", "pause", "partition")
#: The lakehouse on S3: the run's MinIO paused and killed, besides process kills and
#: pauses of the servers and clients that write to it and commit.
S3_FAULTS: Final = ("kill", "pause", "s3-pause", "s3-kill")


@dataclass(frozen=True, slots=True)
class SuiteRun:
    name: str
    config: RunConfig


def suite_runs(out: Path, work: Path, seed: int, scale: float) -> list[SuiteRun]:
    def run(name: str, duration_s: float, **kwargs: Any) -> SuiteRun:
        config = RunConfig(
            out_dir=out / name,
            work_dir=work / name,
            duration_s=max(10.0, duration_s * scale),
            seed=seed,
            gzip_history=True,
            **kwargs,
        )
        return SuiteRun(name, config)

    # Long quiet gaps on Cassandra: a node takes seconds to rejoin, and the run
    # should measure the system between faults as well as during them.
    cassandra = {"cassandra_nodes": 3, "fault_gap_s": 6.0}
    return [
        run(
            "cassandra3-list-append-serializable",
            900,
            workload="list-append",
            isolation="serializable",
            nemeses=ALL_FAULTS,
            **cassandra,
        ),
        run(
            "cassandra3-bank-snapshot",
            480,
            workload="bank",
            isolation="snapshot",
            nemeses=NO_SLOW,
            **cassandra,
        ),
        run(
            "cassandra3-lakehouse",
            300,
            workload="lakehouse",
            nemeses=NO_SLOW,
            clients=4,
            **cassandra,
        ),
        run(
            "sqlite-lakehouse-s3",
            240,
            workload="lakehouse",
            warehouse="s3",
            nemeses=S3_FAULTS,
            fault_gap_s=2.0,
            lakehouse_log_retention_s=5.0,
        ),
        run(
            "sqlite-list-append-snapshot",
            420,
            workload="list-append",
            isolation="snapshot",
            nemeses=SQLITE_FAULTS,
            fault_gap_s=3.0,
        ),
        run(
            "sqlite-bank-serializable",
            360,
            workload="bank",
            isolation="serializable",
            nemeses=SQLITE_FAULTS,
            fault_gap_s=3.0,
        ),
    ]


def run_suite(
    out: Path, work: Path, *, seed: int, scale: float, only: set[str] | None = None
) -> int:
    """Run the suite; the exit code is the worst of the runs' (0 clean, 1 anomalies)."""
    from percolake.tools.chaos._run import run

    out.mkdir(parents=True, exist_ok=True)
    every = suite_runs(out, work, seed, scale)
    runs = [r for r in every if only is None or r.name in only]
    worst = 0
    # Runs not repeated this time (``--only``) keep their earlier results.
    summaries = [s for s in _earlier(out) if s["name"] not in {r.name for r in runs}]
    order = {r.name: i for i, r in enumerate(every)}
    started = time.monotonic()
    for index, item in enumerate(runs, start=1):
        log.info("suite run %d/%d: %s", index, len(runs), item.name)
        shutil.rmtree(item.config.out_dir, ignore_errors=True)
        code = run(replace(item.config))
        worst = max(worst, code)
        summaries.append(_summary(item, code))
        summaries.sort(key=lambda s: order.get(s["name"], len(order)))
        if code == 0:
            shutil.rmtree(item.config.work, ignore_errors=True)
        _write_summary(out, summaries, time.monotonic() - started)
    return worst


def _earlier(out: Path) -> list[dict[str, Any]]:
    try:
        runs: list[dict[str, Any]] = json.loads((out / "summary.json").read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return []
    return runs


def _summary(item: SuiteRun, code: int) -> dict[str, Any]:
    path = item.config.out_dir / "report.json"
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return {
        "name": item.name,
        "exit": code,
        "workload": item.config.workload,
        "isolation": item.config.isolation,
        "store": ("cassandra x3" if item.config.cassandra_nodes else "sqlite")
        + (" + s3 (MinIO)" if item.config.warehouse == "s3" else ""),
        "nemesis": list(item.config.nemeses),
        "duration_s": item.config.duration_s,
        "seed": item.config.seed,
        "valid": report.get("valid"),
        "ops_ok": report.get("ops_ok", 0),
        "ops_fail": report.get("ops_fail", 0),
        "ops_info": report.get("ops_info", 0),
        "faults": len(report.get("faults", [])),
        "anomalies": len(report.get("anomalies", [])),
        "wall_s": report.get("wall_s"),
        "report": f"{item.name}/report.json",
    }


def _write_summary(out: Path, runs: list[dict[str, Any]], elapsed_s: float) -> None:
    totals = {
        key: sum(r[key] or 0 for r in runs)
        for key in ("ops_ok", "ops_fail", "ops_info", "faults", "anomalies", "duration_s")
    }
    totals["transactions"] = totals["ops_ok"] + totals["ops_fail"] + totals["ops_info"]
    summary = {"runs": runs, "totals": totals, "last_suite_wall_s": round(elapsed_s, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        "# Chaos suite results (`make chaos`)",
        "",
        "| run | store | nemesis | s | ok | fail | info | faults | anomalies |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        lines.append(
            f"| [{r['name']}]({r['report']}) | {r['store']} | {','.join(r['nemesis'])} | "
            f"{r['duration_s']:.0f} | {r['ops_ok']} | {r['ops_fail']} | {r['ops_info']} | "
            f"{r['faults']} | {r['anomalies']} |"
        )
    lines += [
        "",
        f"Total: {totals['transactions']} transactions ({totals['ops_ok']} ok) in "
        f"{totals['duration_s'] / 60:.0f} minutes of faults, {totals['faults']} faults, "
        f"{totals['anomalies']} anomalies.",
        "",
    ]
    (out / "SUMMARY.md").write_text("\n".join(lines))
