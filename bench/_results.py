"""Benchmark results in the format of CONTRACT.md ("Benchmark results")."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

RESULTS_DIR = Path(__file__).parent / "results"


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    value: float
    unit: str
    runs: int
    spread: float  # (max - min) / median over the runs, as a fraction
    anchor: str  # what this is compared with, and where that figure comes from
    note: str = ""


def measure(
    name: str, unit: str, anchor: str, runs: int, once: Callable[[], float], note: str = ""
) -> Figure:
    """Run ``once`` ``runs`` times; report the median and the relative spread."""
    values = [once() for _ in range(runs)]
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median if median else 0.0
    return Figure(name, round(median, 3), unit, runs, round(spread, 3), anchor, note)


def machine() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def versions(packages: Sequence[str]) -> dict[str, str]:
    out = {}
    for package in packages:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def write_results(figures: Sequence[Figure], name: str = "latest") -> Path:
    """Write ``results/<name>.json`` and a dated copy; merge with figures already there."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    merged: dict[str, dict[str, object]] = {}
    if path.exists():
        for old in json.loads(path.read_text()).get("figures", []):
            merged[old["name"]] = old
    for figure in figures:
        merged[figure.name] = asdict(figure)
    doc = {
        "machine": machine(),
        "versions": versions(
            ["percolake", "cassandra-driver", "pyspark", "deltalake", "pyiceberg", "grpcio"]
        ),
        "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "figures": sorted(merged.values(), key=lambda f: str(f["name"])),
    }
    text = json.dumps(doc, indent=2) + "\n"
    path.write_text(text)
    (RESULTS_DIR / f"{name}-{dt.date.today().isoformat()}.json").write_text(text)
    return path
