"""``python -m bench --quick`` end to end, as ``make bench`` runs it: every suite in one
process tree, Cassandra started by the runner itself, results and plots written, and
neither the README's summary nor docs/benchmarks.md touched."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import BENCHMARKS, CONTRACT_FIGURES, README

pytestmark = [pytest.mark.integration, pytest.mark.bench, pytest.mark.cassandra, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_quick_bench_runs_every_suite_and_writes_every_contract_figure(tmp_path: Path) -> None:
    if os.environ.get("PERCOLAKE_SKIP_CASSANDRA"):
        pytest.skip("PERCOLAKE_SKIP_CASSANDRA is set")
    reports_before = {path: path.read_text() for path in (README, BENCHMARKS)}
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads((out / "latest.json").read_text())
    assert results["mode"] == "quick"
    figures = {f["name"]: f for f in results["figures"]}
    # Quick mode lists files after 10,000 commits, not 100,000, and measures the
    # deployed topology (appends, hot keys) with the gateway on SQLite only (no
    # Cassandra cluster).
    wanted = {
        n.replace("commits100000", "commits10000")
        for n in CONTRACT_FIGURES
        if not n.startswith("lakehouse.appends.cassandra") and ".cassandra3." not in n
    }
    assert "lakehouse.appends.writers8.vs_writers1.ratio" in wanted
    assert wanted <= figures.keys(), wanted - figures.keys()
    for figure in figures.values():
        assert math.isfinite(figure["value"]) and figure["value"] >= 0, figure
    series = json.loads((out / "latest-series.json").read_text())["series"]
    assert {s["kind"] for s in series} == {"growth", "latency"}
    assert (out / "plot_ratios.png").exists()
    assert len(list(out.glob("plot_*.png"))) == len(series) + 1
    for path, before in reports_before.items():
        assert path.read_text() == before, f"a quick run rewrote {path}"
