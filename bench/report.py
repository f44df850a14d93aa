"""Render bench/results/latest.json: the README table and PNG plots.

The README's table sits between two markers and is rewritten from the results
file, so the two cannot disagree (a test checks it).
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


def table(results: dict[str, Any]) -> str:
    lines = [
        "| figure | value | unit | runs | spread | compared with |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    for f in results["figures"]:
        anchor = str(f.get("anchor", "")).replace("|", "/")
        lines.append(
            f"| `{f['name']}` | {_value(float(f['value']))} | {f['unit']} | {f['runs']} | "
            f"{float(f['spread']):.0%} | {anchor} |"
        )
    machine = results.get("machine", {})
    lines.append("")
    lines.append(
        f"Measured {results.get('written_at', '?')} on {machine.get('cpus', '?')} CPUs, "
        f"Python {machine.get('python', '?')}; spread is (max - min) / median over the runs."
    )
    return "\n".join(lines)


def readme_with_table(readme: str, results: dict[str, Any]) -> str:
    block = f"{START}\n{table(results)}\n{END}"
    if START not in readme:
        raise ValueError(f"README has no {START} marker")
    return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, readme, flags=re.S)


def update_readme(results_path: Path = RESULTS, readme_path: Path = README) -> None:
    results = json.loads(results_path.read_text())
    readme_path.write_text(readme_with_table(readme_path.read_text(), results))


def plot(results_path: Path = RESULTS) -> list[Path]:
    """Bar charts of every figure, grouped by unit; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(results_path.read_text())
    by_unit: dict[str, list[dict[str, Any]]] = {}
    for f in results["figures"]:
        by_unit.setdefault(str(f["unit"]), []).append(f)
    written = []
    for unit, figures in sorted(by_unit.items()):
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(figures) + 1.5))
        names = [str(f["name"]) for f in figures]
        values = [float(f["value"]) for f in figures]
        errors = [float(f["value"]) * float(f["spread"]) / 2 for f in figures]
        ax.barh(names, values, xerr=errors, color="#4c72b0")
        ax.set_xlabel(unit)
        if unit.endswith("/s") and max(values) / max(min(values), 1e-9) > 100:
            ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_title(f"percolake benchmarks: {unit}")
        fig.tight_layout()
        slug = re.sub(r"[^a-z0-9]+", "_", unit.lower()).strip("_")
        path = results_path.parent / f"plot_{slug}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


if __name__ == "__main__":
    update_readme()
    for png in plot():
        print(f"wrote {png}")
