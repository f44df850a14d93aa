"""A chaos run whose faults run late keeps its whole schedule (``MAX_STRETCH``).

On a loaded machine a fault's injection (a server started) or heal (a takeover awaited)
takes longer than planned. The nemesis used to drop the faults that no longer fitted
before the clients' deadline, and tests that count faults failed on the landing CI. Now
the faults after a late one keep their planned gaps and the deadline moves with them,
up to ``MAX_STRETCH`` times the planned duration; clients read the new deadline from
the start file when they reach the old one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from percolake.tools.chaos import MAX_STRETCH, RunConfig
from percolake.tools.chaos._cluster import Cluster
from percolake.tools.chaos._nemesis import Nemesis, PlannedFault
from percolake.tools.chaos._procs import PidRegistry
from percolake.tools.chaos.client import _wait_for_start


class _SlowNemesis(Nemesis):
    """Faults that do nothing but take ``inject_s`` to inject and ``heal_s`` to heal."""

    def __init__(self, cluster: Cluster, *, inject_s: float, heal_s: float) -> None:
        super().__init__(cluster, None)
        self.inject_s = inject_s
        self.heal_s = heal_s

    def _inject(self, fault: PlannedFault) -> tuple[Callable[[], Any], dict[str, Any]]:
        time.sleep(self.inject_s)
        return (lambda: time.sleep(self.heal_s)), {}


def _cluster(tmp_path: Path, duration_s: float) -> Cluster:
    config = RunConfig(workload="list-append", out_dir=tmp_path)
    cluster = Cluster(config, tmp_path, PidRegistry(tmp_path), isolated=False)
    cluster.t0_ns = time.monotonic_ns()
    cluster.until_ns = cluster.t0_ns + int(duration_s * 1e9)
    cluster.start_file.write_text(f"{cluster.t0_ns} {cluster.until_ns}\n")
    return cluster


SCHEDULE = [PlannedFault(0.1, "pause", "tso", 0.1), PlannedFault(0.5, "pause", "tso", 0.1)]


def test_late_faults_shift_the_rest_of_the_plan_and_the_deadline(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, 1.2)
    planned_until = cluster.until_ns
    nemesis = _SlowNemesis(cluster, inject_s=0.5, heal_s=0.3)
    nemesis.run(SCHEDULE, threading.Event())
    # Both faults ran: the first one's 0.5 s injection and 0.3 s heal shifted the second.
    assert len(nemesis.faults) == 2, nemesis.faults
    assert nemesis.faults[1]["start_s"] >= 0.5 + 0.7
    # The deadline moved as late as the faults did, and the clients' start file says so.
    late_s = (cluster.until_ns - planned_until) / 1e9
    assert 0.7 <= late_s <= MAX_STRETCH * 1.2, late_s
    assert _wait_for_start(cluster.start_file) == (cluster.t0_ns, cluster.until_ns)


def test_the_stretch_is_bounded(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, 0.5)
    planned_until = cluster.until_ns
    # The injection outlasts even the stretched deadline (0.5 + 0.5 s).
    nemesis = _SlowNemesis(cluster, inject_s=1.2, heal_s=0.0)
    nemesis.run(SCHEDULE, threading.Event())
    # At most MAX_STRETCH times the planned duration later; what no longer fits is dropped.
    assert cluster.until_ns - planned_until <= int(MAX_STRETCH * 0.5 * 1e9)
    assert len(nemesis.faults) == 1, nemesis.faults


def test_a_heal_still_running_at_the_deadline_keeps_it_and_the_next_fault_runs(
    tmp_path: Path,
) -> None:
    """The landing CI of stop 41's tree: a leader kill at 4.5 s of an 11 s run healed
    (restart, takeover) at 12.4 s, past the deadline, which could then no longer move,
    and the two kills planned after it were dropped. While a heal runs near the deadline
    the deadline now moves on, so the plan goes on after the heal."""
    cluster = _cluster(tmp_path, 1.0)
    planned_until = cluster.until_ns
    nemesis = _SlowNemesis(cluster, inject_s=0.0, heal_s=1.2)  # ends at 1.4 s, past 1.0
    nemesis.run(SCHEDULE, threading.Event())
    assert len(nemesis.faults) == 2, nemesis.faults
    assert nemesis.faults[0]["end_s"] >= 1.2
    assert nemesis.faults[1]["start_s"] >= nemesis.faults[0]["end_s"]
    late_s = (cluster.until_ns - planned_until) / 1e9
    assert 1.0 <= late_s <= MAX_STRETCH * 1.0, late_s
    assert _wait_for_start(cluster.start_file) == (cluster.t0_ns, cluster.until_ns)


def test_a_deadline_already_passed_is_not_moved(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, 0.3)
    time.sleep(0.3)
    assert not cluster.extend_until(cluster.until_ns + 1_000_000_000)
    assert _wait_for_start(cluster.start_file)[1] == cluster.until_ns


def test_stretches_add_up_to_the_bound_to_the_nanosecond(tmp_path: Path) -> None:
    """A stretch by an odd fraction of a second, then one past the bound: the deadline
    ends exactly ``MAX_STRETCH`` times the planned duration later. In floats, with each
    deadline truncated to whole nanoseconds, the planned duration crept down by one or
    two nanoseconds per stretch, and the CI run of 6e0af18 saw 0.999999998 s where the
    test above asserts at least 1 s."""
    cluster = _cluster(tmp_path, 1.0)
    planned_until = cluster.until_ns
    nemesis = _SlowNemesis(cluster, inject_s=0.0, heal_s=0.0)
    for late_s in (0.000123457, 0.3333333337, 0.7000000001, 5.0):
        nemesis._stretch(late_s)
    assert cluster.until_ns - planned_until == int(MAX_STRETCH * 1_000_000_000)
