"""Pytest plugin: the CPU each test costs, with the processes it starts, on request.

The suite is CPU-bound on two cores (issue 29): a test's wall time says how long it
waited as much as what it cost, because the other worker's test competes for the same
cores. With ``PERCOLAKE_TEST_CPU=FILE`` each worker appends one JSON line per test to
``FILE.<worker>``: the test id, its wall time and the CPU seconds (user + system) of the
worker's process tree over the test, which takes in the shared JVMs (the Spark driver,
the Cassandra nodes) when the test makes them work, every server and chaos client the
test starts, and their children once reaped. ``python -m tests.cpu_plugin FILE``
sums the lines by file, group and test. Off by default: a scan of ``/proc`` before and
after each test costs a few milliseconds.

The figure is low, even negative, for a test that kills a process whose parent does
not wait for it (its CPU before the test was counted, and no parent's children times
take it in afterwards): the Spark task-crash and S3-kill tests. Sums over files and
groups are what it is for.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "PERCOLAKE_TEST_CPU"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, each with its reaped children."""
    stats: dict[int, tuple[int, float]] = {}  # pid -> (ppid, cpu_s)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        # After the command: state ppid ... utime(11) stime(12) cutime(13) cstime(14).
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        stats[int(entry.name)] = (int(fields[1]), ticks * _TICK_S)
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, (ppid, _) in stats.items():
        children[ppid].append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, ()))
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    target = os.environ.get(ENV)
    if not target:
        yield
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    cpu_before, wall_before = _tree_cpu_s(os.getpid()), time.monotonic()
    yield
    line = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - wall_before, 3),
        "cpu_s": round(_tree_cpu_s(os.getpid()) - cpu_before, 3),
        "worker": worker,
    }
    with open(f"{target}.{worker}", "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def _summary(prefix: str, top: int = 40) -> str:
    rows = [
        json.loads(line)
        for path in sorted(Path(prefix).parent.glob(Path(prefix).name + ".*"))
        for line in path.read_text().splitlines()
    ]
    by_file: collections.Counter[str] = collections.Counter()
    by_group: collections.Counter[str] = collections.Counter()
    for row in rows:
        test = row["test"]
        by_file[test.split("::")[0]] += row["cpu_s"]
        by_group[test.rsplit("@", 1)[1] if "@" in test else "(none)"] += row["cpu_s"]
    lines = [
        f"{len(rows)} tests: {sum(r['cpu_s'] for r in rows):.0f} CPU-s, "
        f"{sum(r['wall_s'] for r in rows):.0f} s of test time"
    ]
    lines += ["", "by group:"] + [f"{v:8.1f}  {k}" for k, v in by_group.most_common()]
    lines += ["", "by file:"] + [f"{v:8.1f}  {k}" for k, v in by_file.most_common(top)]
    lines += ["", "by test (CPU-s, wall s):"] + [
        f"{r['cpu_s']:8.1f} {r['wall_s']:7.1f}  {r['test']}"
        for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(_summary(sys.argv[1]) + "\n")
