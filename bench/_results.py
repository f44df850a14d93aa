"""Benchmark results in the format docs/benchmarks.md describes.

A suite's ``run(quick, progress)`` returns :class:`Figure` items (one number each,
the contract's format) and, for the plots, :class:`Growth` curves (how a cost grows
with the work) and :class:`Latency` distributions. Figures go to
``<out>/latest.json`` plus a dated copy; curves and distributions to
``<out>/latest-series.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"
#: Quick runs write here, so they never replace the full results the README shows.
QUICK_DIR = RESULTS_DIR / "quick"

PACKAGES = (
    "percolake",
    "cassandra-driver",
    "grpcio",
    "pyspark",
    "pyarrow",
    "deltalake",
    "pyiceberg",
    "SQLAlchemy",
)


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    value: float
    unit: str
    runs: int
    spread: float  # (max - min) / median over the runs, as a fraction
    anchor: str  # what this is compared with, and where that figure comes from
    note: str = ""


@dataclass(frozen=True, slots=True)
class Growth:
    """How a measure grows with the work: one line per system, points ``(x, y)``."""

    name: str
    title: str
    x_label: str
    y_label: str
    lines: dict[str, list[tuple[float, float]]]
    log_x: bool = True
    log_y: bool = False
    note: str = ""


#: Percentiles kept of each latency distribution: enough to draw its CDF.
PERCENTILES = (*range(0, 100), 99.5, 99.9, 100)


@dataclass(frozen=True, slots=True)
class Latency:
    """Latency distributions to compare, one per system, each kept as percentiles."""

    name: str
    title: str
    unit: str
    distributions: dict[str, dict[str, float]]  # label -> {"p50": ..., "count": ...}
    note: str = ""

    @classmethod
    def of(
        cls,
        name: str,
        title: str,
        unit: str,
        samples: Mapping[str, Sequence[float]],
        note: str = "",
    ) -> Latency:
        return cls(name, title, unit, {k: percentiles(v) for k, v in samples.items()}, note)


Result = Figure | Growth | Latency


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """The :data:`PERCENTILES` of ``samples`` (nearest rank) and their count."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    out: dict[str, float] = {"count": float(len(ordered))}
    for p in PERCENTILES:
        rank = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
        out[f"p{p:g}"] = round(ordered[rank], 4)
    return out


def measure(
    name: str, unit: str, anchor: str, runs: int, once: Callable[[], float], note: str = ""
) -> Figure:
    """Run ``once`` ``runs`` times; report the median and the relative spread."""
    return summarize(name, unit, anchor, [once() for _ in range(runs)], note)


def summarize(name: str, unit: str, anchor: str, values: Sequence[float], note: str = "") -> Figure:
    """A figure from values already measured: their median and relative spread."""
    if not values:
        raise ValueError(f"{name}: no values")
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median if median else 0.0
    return Figure(name, round(median, 3), unit, len(values), round(spread, 3), anchor, note)


def machine() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def versions(packages: Iterable[str] = PACKAGES) -> dict[str, str]:
    out = {}
    for package in packages:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def write_for_command(results: Sequence[Result], *, quick: bool) -> Path:
    """What a suite's own ``--write`` does: merge into ``bench/results`` (``quick/`` for
    a quick run) and say where."""
    return write_results(results, QUICK_DIR if quick else RESULTS_DIR, "quick" if quick else "full")


def write_results(
    results: Sequence[Result],
    out: Path = RESULTS_DIR,
    mode: str = "full",
    merge: bool = True,
) -> Path:
    """Write ``<out>/latest.json`` (figures) and ``latest-series.json`` (plots' data),
    each with a dated copy; returns the figures file.

    With ``merge``, results of suites not run this time are kept from the files
    already there, so ``--only`` refreshes part of a full run.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / "latest.json"
    series_path = out / "latest-series.json"
    figures: dict[str, dict[str, Any]] = {}
    series: dict[str, dict[str, Any]] = {}
    if merge and path.exists():
        figures = {f["name"]: f for f in json.loads(path.read_text()).get("figures", [])}
    if merge and series_path.exists():
        series = {s["name"]: s for s in json.loads(series_path.read_text()).get("series", [])}
    for result in results:
        doc = asdict(result)
        if isinstance(result, Figure):
            figures[result.name] = doc
        else:
            doc["kind"] = "growth" if isinstance(result, Growth) else "latency"
            series[result.name] = doc
    now = dt.datetime.now(dt.UTC)
    header = {
        "machine": machine(),
        "versions": versions(),
        "mode": mode,
        "written_at": now.isoformat(timespec="seconds"),
    }
    day = now.date().isoformat()
    for target, doc in (
        (path, {**header, "figures": sorted(figures.values(), key=lambda f: str(f["name"]))}),
        (series_path, {**header, "series": sorted(series.values(), key=lambda s: str(s["name"]))}),
    ):
        text = json.dumps(doc, indent=2) + "\n"
        target.write_text(text)
        target.with_name(f"{target.stem}-{day}.json").write_text(text)
    return path


class MachineLoad:
    """How busy the shared machine was while a suite ran: the 1-minute load average
    when it started (construction) and when it ended (:meth:`note`)."""

    def __init__(self) -> None:
        self.started = os.getloadavg()[0]

    def note(self) -> str:
        return (
            f"1-min load average {self.started:.1f} when the suite started, "
            f"{os.getloadavg()[0]:.1f} when it ended"
        )

    def stamp(self, results: Sequence[Result], *more: str) -> list[Result]:
        """``results`` with ``more`` (the topology, say) and the load added to each
        figure's note."""
        extra = "; ".join((*more, self.note()))
        return [
            replace(r, note=f"{r.note}; {extra}") if isinstance(r, Figure) else r for r in results
        ]
