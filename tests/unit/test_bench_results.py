"""The benchmark results format: medians and spreads, percentiles, merging, plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._results import (
    Figure,
    Growth,
    Latency,
    MachineLoad,
    percentiles,
    summarize,
    write_results,
)
from bench.report import plot, table

pytestmark = pytest.mark.unit


def test_summarize_reports_the_median_and_the_relative_spread() -> None:
    figure = summarize("x.per_s", "ops/s", "anchor", [90.0, 100.0, 120.0])
    assert (figure.value, figure.runs, figure.spread) == (100.0, 3, 0.3)


def test_summarize_refuses_no_values() -> None:
    with pytest.raises(ValueError, match=r"x\.per_s: no values"):
        summarize("x.per_s", "ops/s", "anchor", [])


def test_percentiles_use_nearest_rank_and_keep_the_count() -> None:
    got = percentiles([float(v) for v in range(1, 102)])  # 1..101
    assert got["count"] == 101
    assert (got["p0"], got["p50"], got["p99"], got["p100"]) == (1, 51, 100, 101)
    with pytest.raises(ValueError):
        percentiles([])


def _results() -> list[Figure | Growth | Latency]:
    return [
        summarize("a.vs_b.ratio", "x", "b, same run", [1.5, 2.0]),
        summarize("a.per_s", "ops/s", "b", [10.0]),
        Growth("a.by_n", "A by n", "n", "ms", {"a": [(1, 2.0), (10, 3.0)], "b": [(1, 1.0)]}),
        Latency.of("a.latency", "A latency", "ms", {"a": [1.0, 2.0, 3.0], "b": [2.0, 4.0]}),
    ]


def test_write_results_writes_figures_series_and_dated_copies(tmp_path: Path) -> None:
    path = write_results(_results(), tmp_path, mode="quick", merge=False)
    doc = json.loads(path.read_text())
    assert doc["mode"] == "quick"
    assert [f["name"] for f in doc["figures"]] == ["a.per_s", "a.vs_b.ratio"]
    series = json.loads((tmp_path / "latest-series.json").read_text())["series"]
    assert {s["name"]: s["kind"] for s in series} == {"a.by_n": "growth", "a.latency": "latency"}
    assert len(list(tmp_path.glob("latest-2*.json"))) == 1
    assert len(list(tmp_path.glob("latest-series-2*.json"))) == 1
    assert ", quick mode," in table(doc)


def test_a_partial_run_merges_into_the_results_already_there(tmp_path: Path) -> None:
    write_results(_results(), tmp_path, merge=False)
    write_results([summarize("a.per_s", "ops/s", "b", [20.0])], tmp_path, merge=True)
    figures = {
        f["name"]: f["value"] for f in json.loads((tmp_path / "latest.json").read_text())["figures"]
    }
    assert figures == {"a.per_s": 20.0, "a.vs_b.ratio": 1.75}
    write_results([summarize("c.per_s", "ops/s", "b", [1.0])], tmp_path, merge=False)
    figures = {
        f["name"]: f["value"] for f in json.loads((tmp_path / "latest.json").read_text())["figures"]
    }
    assert figures == {"c.per_s": 1.0}


def test_plot_draws_ratios_growth_and_latency_and_drops_stale_plots(tmp_path: Path) -> None:
    (tmp_path / "plot_old.png").write_bytes(b"stale")
    path = write_results(_results(), tmp_path, merge=False)
    written = {p.name for p in plot(path)}
    assert written == {"plot_ratios.png", "plot_growth_a_by_n.png", "plot_latency_a_latency.png"}
    assert not (tmp_path / "plot_old.png").exists()
    for name in written:
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_machine_load_stamps_each_figure_with_the_topology_and_the_load() -> None:
    """A figure says where it ran and how busy the shared machine was; a latency
    distribution's note is left alone."""
    figure = Figure("f", 1.0, "x", 1, 0.0, "anchor", "paired runs")
    latency = Latency("l", "title", "ms", {"a": {"p50": 1.0}}, note="as measured")
    stamped = MachineLoad().stamp([figure, latency], "3 nodes, replication factor 3")
    assert isinstance(stamped[0], Figure)
    assert stamped[0].note.startswith("paired runs; 3 nodes, replication factor 3; 1-min load")
    assert "when the suite started" in stamped[0].note and stamped[0].value == 1.0
    assert stamped[1] == latency
