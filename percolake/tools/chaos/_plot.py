"""Throughput and latency over time, fault windows shaded: one PNG per run."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_FAULT_COLOURS = {
    "kill": "tab:red",
    "pause": "tab:orange",
    "partition": "tab:purple",
    "slow": "tab:olive",
    "oracle-overlap": "tab:brown",
}
_OUTCOME_COLOURS = {"ok": "tab:green", "fail": "tab:gray", "info": "tab:red"}


def latencies(ops: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """``(completion time s, latency s, outcome)`` of every completed client operation."""
    invoked: dict[Any, int] = {}
    out = []
    for op in ops:
        if op["process"] == "nemesis":
            continue
        if op["type"] == "invoke":
            invoked[op["process"]] = op["time"]
        elif op["process"] in invoked:
            began = invoked.pop(op["process"])
            out.append((op["time"] / 1e9, (op["time"] - began) / 1e9, op["type"]))
    return out


def plot_run(
    path: Path,
    ops: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    title: str,
    duration_s: float,
) -> Path | None:
    """Write the plot; ``None`` (and a warning) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        log.warning("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    points = latencies(ops)
    bucket_s = max(1.0, duration_s / 300)
    buckets = int(duration_s // bucket_s) + 2
    rates = {kind: [0.0] * buckets for kind in _OUTCOME_COLOURS}
    for at, _, kind in points:
        index = min(max(int(at // bucket_s), 0), buckets - 1)
        rates[kind][index] += 1 / bucket_s
    xs = [i * bucket_s for i in range(buckets)]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for kind, colour in _OUTCOME_COLOURS.items():
        top.plot(xs, rates[kind], color=colour, label=kind, linewidth=1.2)
    top.set_ylabel("operations / s")
    top.set_title(title)
    for kind, colour in _OUTCOME_COLOURS.items():
        sample = [(t, lat) for t, lat, k in points if k == kind]
        if len(sample) > 8_000:  # keep the file small; the shape stays the same
            sample = sample[:: len(sample) // 8_000 + 1]
        if sample:
            bottom.scatter(
                [t for t, _ in sample],
                [max(lat * 1000, 0.1) for _, lat in sample],
                s=3,
                alpha=0.5,
                color=colour,
                label=kind,
            )
    bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds since the clients started")
    used = set()
    for fault in faults:
        colour = _FAULT_COLOURS.get(fault["kind"], "tab:blue")
        used.add(fault["kind"])
        for axis in (top, bottom):
            axis.axvspan(
                fault["start_s"], fault.get("end_s", fault["start_s"]), color=colour, alpha=0.15
            )
    handles, labels = top.get_legend_handles_labels()
    handles += [Patch(color=_FAULT_COLOURS.get(k, "tab:blue"), alpha=0.3) for k in sorted(used)]
    labels += sorted(used)
    top.legend(handles, labels, loc="upper right", fontsize="small", ncol=2)
    bottom.legend(loc="upper right", fontsize="small", markerscale=4)
    # Fixed margins, not tight_layout(): that draws the whole figure once more only to
    # measure it, half the cost of a plot with thousands of points.
    fig.subplots_adjust(left=0.07, right=0.985, top=0.95, bottom=0.08, hspace=0.06)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
