"""Render the benchmark results: the README table and the PNG plots.

The README's table sits between two markers and is rewritten from
``bench/results/latest.json``, so the two cannot disagree (a test checks it).
The plots are drawn from ``latest.json`` and ``latest-series.json``:

- ``plot_ratios.png``: every ``*.ratio`` figure against its anchor, 1.0 marked;
- ``plot_growth_<name>.png``: how a cost grows with the work (cells per transaction,
  commits per table, concurrent writers, history length);
- ``plot_latency_<name>.png``: latency distributions as CDFs with a log x axis.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "latest.json"
README = Path(__file__).parent.parent / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def _value(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.2f}"
    return f"{v:.3f}"


def _rows(figures: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| figure | value | unit | runs | spread | compared with |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    for f in figures:
        anchor = str(f.get("anchor", "")).replace("|", "/")
        lines.append(
            f"| `{f['name']}` | {_value(float(f['value']))} | {f['unit']} | {f['runs']} | "
            f"{float(f['spread']):.0%} | {anchor} |"
        )
    return lines


def table(results: dict[str, Any], series: list[dict[str, Any]] | None = None) -> str:
    """The README block: every ratio against its anchor first, then links to the
    plots, then every figure."""
    figures = results["figures"]
    ratios = [f for f in figures if str(f["name"]).endswith(".ratio")]
    machine = results.get("machine", {})
    lines = [
        f"Results file last written {results.get('written_at', '?')}, "
        f"{results.get('mode', '?')} mode, on {machine.get('cpus', '?')} CPUs, "
        f"Python {machine.get('python', '?')} (a suite rerun with `--only` merges into it); "
        "value is the median over the runs, spread is (max - min) / median.",
        "",
        f"**Side by side** ({len(ratios)} ratios; each figure's note in the results file "
        "says which way round it is):",
        "",
        *_rows(ratios),
        "",
        "![ratios](bench/results/plot_ratios.png)",
    ]
    if series:
        lines += ["", "Plots of how costs grow and of latency distributions:", ""]
        for s in series:
            png = f"bench/results/plot_{s['kind']}_{_slug(str(s['name']))}.png"
            lines.append(f"- [{s['title']}]({png})")
    lines += [
        "",
        f"<details><summary>All {len(figures)} figures</summary>",
        "",
        *_rows(figures),
        "",
        "</details>",
    ]
    return "\n".join(lines)


def readme_with_table(
    readme: str, results: dict[str, Any], series: list[dict[str, Any]] | None = None
) -> str:
    block = f"{START}\n{table(results, series)}\n{END}"
    if START not in readme:
        raise ValueError(f"README has no {START} marker")
    return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, readme, flags=re.S)


def load_series(results_path: Path = RESULTS) -> list[dict[str, Any]]:
    """The growth curves and latency distributions written next to ``results_path``."""
    path = results_path.with_name(f"{results_path.stem}-series.json")
    return list(json.loads(path.read_text())["series"]) if path.exists() else []


def update_readme(results_path: Path = RESULTS, readme_path: Path = README) -> None:
    results = json.loads(results_path.read_text())
    series = load_series(results_path)
    readme_path.write_text(readme_with_table(readme_path.read_text(), results, series))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def plot(results_path: Path = RESULTS) -> list[Path]:
    """Draw every plot next to ``results_path``; returns the files written.

    Plots left from an earlier run are removed first, so the directory shows only
    what the results files hold.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = results_path.parent
    for old in folder.glob("plot_*.png"):
        old.unlink()
    results = json.loads(results_path.read_text())
    series = load_series(results_path)
    written = []

    ratios = [f for f in results["figures"] if str(f["name"]).endswith(".ratio")]
    if ratios:
        fig, ax = plt.subplots(figsize=(11, 0.42 * len(ratios) + 1.6))
        names = [str(f["name"]).removesuffix(".ratio") for f in ratios]
        values = [float(f["value"]) for f in ratios]
        errors = [float(f["value"]) * float(f["spread"]) / 2 for f in ratios]
        # Green where percolake is ahead: a ratio above 1, or an overhead below it.
        ahead = [(v >= 1) != ("overhead" in n) for n, v in zip(names, values, strict=True)]
        colors = ["#55a868" if a else "#c44e52" for a in ahead]
        ax.barh(names, values, xerr=errors, color=colors)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel(
            "ratio against the anchor (log); green: percolake ahead, red: behind; whiskers: spread"
        )
        ax.invert_yaxis()
        ax.set_title("percolake against each anchor (Percolator: published; the rest: same run)")
        fig.tight_layout()
        path = folder / "plot_ratios.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    for s in series:
        fig, ax = plt.subplots(figsize=(8, 5))
        if s["kind"] == "growth":
            for label, points in s["lines"].items():
                xs = [float(x) for x, _ in points]
                ys = [float(y) for _, y in points]
                ax.plot(xs, ys, marker="o", label=label)
            ax.set_xlabel(s["x_label"])
            ax.set_ylabel(s["y_label"])
            if s.get("log_x", True):
                ax.set_xscale("log")
            if s.get("log_y", False):
                ax.set_yscale("log")
            prefix = "growth"
        else:
            for label, dist in s["distributions"].items():
                keys = [k for k in dist if k.startswith("p")]
                ps = [float(k[1:]) / 100 for k in keys]
                xs = [float(dist[k]) for k in keys]
                ax.plot(xs, ps, label=f"{label} (n={dist['count']:.0f})")
            ax.set_xscale("log")
            ax.set_xlabel(f"latency ({s['unit']}, log)")
            ax.set_ylabel("fraction of operations at or below")
            prefix = "latency"
        ax.set_title(s["title"], fontsize=11)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / f"plot_{prefix}_{_slug(s['name'])}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


if __name__ == "__main__":
    update_readme()
    for png in plot():
        print(f"wrote {png}")
