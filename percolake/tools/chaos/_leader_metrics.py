"""How many replicas said they lead, scraped from their metrics during a run.

Each replica of a run serves Prometheus metrics (``--metrics-listen``). A watcher
scrapes ``percolake_is_leader{role="tso"}`` of every replica at once, a few times a
second, and the report gains the leader count over time. The check holds it to what
an operator's alert expects: never two leaders in one sample, and exactly one outside
the fault windows (each fault from its start until a settling time after its end, in
which a takeover completes).

A sample counts only when every replica answered and all its scrapes fell within
``SAMPLE_WINDOW_LEASES`` of a lease: the metric is true at the instant of its scrape,
and two replicas scraped further apart than the gap between one lease's end and the
next one's start (S7) could both truthfully say 1.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from percolake.tools.chaos._workload import CheckResult

log = logging.getLogger(__name__)

#: How often the watcher scrapes every replica.
SCRAPE_INTERVAL_S: Final = 0.25
#: A replica that has not answered within this long counts as not answering.
SCRAPE_TIMEOUT_S: Final = 1.0
#: A sample's scrapes must all fall within this share of a lease (the gap between one
#: leader's lease end and the next one's start is 0.2 lease, tso._lease.DRIFT_MARGIN).
SAMPLE_WINDOW_LEASES: Final = 0.1
#: After a fault ends, leases to allow for a takeover (waiting out a lease, a depose
#: after three of them, a sit-out) before exactly one leader is required again.
SETTLE_LEASES: Final = 8
SETTLE_EXTRA_S: Final = 2.0
#: Examples kept per anomaly type (all are counted).
MAX_EXAMPLES: Final = 20


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float  # when the first scrape of the sample began (since the run's t0)
    window_s: float  # from the first scrape's start to the last one's end
    leading: dict[str, float | None]  # replica -> percolake_is_leader (None: no answer)

    @property
    def complete(self) -> bool:
        return None not in self.leading.values()

    @property
    def leaders(self) -> int:
        return sum(1 for value in self.leading.values() if value == 1)


def scrape_is_leader(port: int, timeout_s: float = SCRAPE_TIMEOUT_S) -> float | None:
    """``percolake_is_leader{role="tso"}`` at ``127.0.0.1:port`` (None: no answer)."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=timeout_s
        ) as response:
            text = response.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    for line in text.splitlines():
        if line.startswith('percolake_is_leader{role="tso"}'):
            return float(line.rsplit(" ", 1)[1])
    return None


class LeaderMetricsWatch:
    """Scrapes every replica's ``percolake_is_leader`` from :meth:`start` to :meth:`stop`."""

    def __init__(self, ports: dict[str, int], lease_ms: int) -> None:
        self._ports = dict(ports)
        self._lease_s = lease_ms / 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0_ns = 0
        self.samples: list[Sample] = []

    def start(self, t0_ns: int) -> None:
        self._t0_ns = t0_ns
        self._thread = threading.Thread(target=self._watch, name="leader-metrics", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        names = sorted(self._ports)
        with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="scrape") as pool:
            while not self._stop.wait(SCRAPE_INTERVAL_S):
                began = time.monotonic_ns()
                values = list(pool.map(scrape_is_leader, [self._ports[n] for n in names]))
                ended = time.monotonic_ns()
                self.samples.append(
                    Sample(
                        at_s=(began - self._t0_ns) / 1e9,
                        window_s=(ended - began) / 1e9,
                        leading=dict(zip(names, values, strict=True)),
                    )
                )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- the report and the check ----------------------------------------------------

    def _conclusive(self, sample: Sample) -> bool:
        return sample.complete and sample.window_s <= SAMPLE_WINDOW_LEASES * self._lease_s

    def _settle_s(self) -> float:
        return SETTLE_LEASES * self._lease_s + SETTLE_EXTRA_S

    def _in_fault(self, at_s: float, faults: list[dict[str, Any]]) -> bool:
        settle = self._settle_s()
        for fault in faults:
            start = float(fault.get("start_s", fault.get("at_s", 0.0)))
            end = float(fault.get("end_s", start + float(fault.get("duration_s", 0.0))))
            if start <= at_s <= end + settle:
                return True
        return False

    def summary(self, faults: list[dict[str, Any]], end_s: float) -> dict[str, Any]:
        """For the report: the leader count over time (each change of it), and how
        many samples were conclusive, inside and outside the fault windows."""
        changes: list[dict[str, Any]] = []
        for sample in self.samples:
            count = sample.leaders if sample.complete else None
            if not changes or changes[-1]["leaders"] != count:
                changes.append(
                    {
                        "at_s": round(sample.at_s, 3),
                        "leaders": count,  # None: a replica did not answer
                        "leading": sorted(n for n, v in sample.leading.items() if v == 1),
                    }
                )
        run = [s for s in self.samples if s.at_s <= end_s]
        conclusive = [s for s in run if self._conclusive(s)]
        outside = [s for s in conclusive if not self._in_fault(s.at_s, faults)]
        return {
            "replicas": sorted(self._ports),
            "samples": len(self.samples),
            "conclusive": len(conclusive),
            "outside_faults": len(outside),
            "outside_faults_one_leader": sum(1 for s in outside if s.leaders == 1),
            "settle_s": self._settle_s(),
            "leader_count": changes,
        }

    def check(self, faults: list[dict[str, Any]], end_s: float) -> CheckResult:
        """Never two leaders in a conclusive sample; exactly one in each conclusive
        sample outside the fault windows."""
        result = CheckResult("leader metrics")
        counts: dict[str, int] = {}

        def flag(kind: str, explanation: str) -> None:
            counts[kind] = counts.get(kind, 0) + 1
            if counts[kind] <= MAX_EXAMPLES:
                result.anomalies.append(
                    {"check": result.name, "type": kind, "explanation": explanation}
                )

        checked = outside = 0
        for sample in self.samples:
            if sample.at_s > end_s or not self._conclusive(sample):
                continue
            checked += 1
            leading = sorted(n for n, v in sample.leading.items() if v == 1)
            if sample.leaders > 1:
                flag(
                    "two-leaders-in-metrics",
                    f"at {sample.at_s:.2f} s {', '.join(leading)} all exported "
                    f"percolake_is_leader 1 (scraped within {sample.window_s * 1000:.0f} ms)",
                )
            elif not self._in_fault(sample.at_s, faults):
                outside += 1
                if sample.leaders != 1:
                    flag(
                        "no-leader-outside-faults",
                        f"at {sample.at_s:.2f} s, {self._settle_s():.1f} s or more after "
                        "every fault, no replica exported percolake_is_leader 1",
                    )
        result.stats.update(
            samples=len(self.samples),
            conclusive=checked,
            outside_faults=outside,
            anomaly_counts=counts,
        )
        return result
