"""The committed benchmark results: complete, rendered into the README, plotted."""

from __future__ import annotations

import json
import math

import pytest

from bench.report import README, RESULTS, _slug, load_series, readme_with_table

pytestmark = pytest.mark.unit

#: The stable names CONTRACT.md ("Benchmark results") lists.
CONTRACT_FIGURES = (
    "cassandra.txn_vs_raw.cells100.ratio",
    "tso.grpc.clients64.ts_per_s",
    "lakehouse.appends.writers8.vs_deltalake.ratio",
    "lakehouse.list_files.commits100000.vs_deltalake.ratio",
    "spark.commit_hook.overhead.ratio",
)
SERIES = RESULTS.with_name("latest-series.json")


def test_readme_table_matches_the_committed_results() -> None:
    results = json.loads(RESULTS.read_text())
    readme = README.read_text()
    assert readme_with_table(readme, results, load_series()) == readme, (
        "run: python -c 'from bench.report import update_readme; update_readme()'"
    )


def test_the_committed_results_are_a_full_run_with_every_contract_figure() -> None:
    results = json.loads(RESULTS.read_text())
    assert results["mode"] == "full"
    names = {f["name"] for f in results["figures"]}
    assert set(CONTRACT_FIGURES) <= names, set(CONTRACT_FIGURES) - names
    assert {"machine", "versions", "figures"} <= results.keys()


def test_every_figure_says_what_runs_spread_and_anchor() -> None:
    for figure in json.loads(RESULTS.read_text())["figures"]:
        assert {"name", "value", "unit", "runs", "spread", "anchor"} <= figure.keys(), figure
        assert figure["runs"] >= 1, figure
        assert math.isfinite(figure["value"]) and figure["spread"] >= 0, figure
        assert figure["anchor"].strip(), figure


def test_anchors_are_compared_within_the_same_run() -> None:
    names = {f["name"] for f in json.loads(RESULTS.read_text())["figures"]}
    for ours, theirs in (
        ("lakehouse.appends.writers8.commits_per_s", "deltalake.appends.writers8.commits_per_s"),
        ("lakehouse.appends.writers8.commits_per_s", "iceberg.appends.writers8.commits_per_s"),
        ("cassandra.txn.cells100.cells_per_s", "cassandra.raw.cells100.cells_per_s"),
    ):
        assert {ours, theirs} <= names, (ours, theirs)


def test_growth_and_latency_series_are_committed_and_plotted() -> None:
    series = json.loads(SERIES.read_text())["series"]
    kinds = {s["kind"] for s in series}
    assert kinds == {"growth", "latency"}
    for s in series:
        png = RESULTS.parent / f"plot_{s['kind']}_{_slug(s['name'])}.png"
        assert png.exists(), png
    assert (RESULTS.parent / "plot_ratios.png").exists()
