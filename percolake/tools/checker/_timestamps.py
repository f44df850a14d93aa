"""Checker for timestamp histories: the oracle's answers are unique and in real-time order.

The history of the chaos ``timestamps`` workload (in the style of AtlasDB TimeLock's
Jepsen test): client processes call ``GetTimestamps(count=1)`` over and over and record
each call as an invocation and a completion, JSON lines of Jepsen's shape::

    {"type": "invoke", "f": "ts", "value": null, "process": 3, "time": 1200300400}
    {"type": "ok", "f": "ts", "value": 4711, "process": 3, "time": 1200500600, "node": "..."}

``time`` is nanoseconds on ``CLOCK_MONOTONIC``, which on Linux is one clock for every
process of a machine, so calls of different processes compare. Failed and unknown
calls (``fail``, ``info``) are left out: only timestamps a client received count.

Two properties, both of a correct timestamp oracle however many replicas it has:

* **unique**: no timestamp is received twice;
* **real-time order** (linearizability of a counter): for any two received calls a, b
  with ``a.complete < b.invoke``, ``ts(a) < ts(b)``. Checked in O(n log n): calls
  sorted by completion, a running maximum of their timestamps, swept along the calls
  sorted by invocation.

A violation names both calls: the later one, and the earlier one that completed
before it began with a timestamp at least as high (the highest such).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from wire.errors import PercolakeError

#: The operation the workload records.
TIMESTAMP_F: Final = "ts"
DUPLICATE: Final = "duplicate-timestamp"
REAL_TIME_ORDER: Final = "real-time-order"
#: Examples kept per violation type (all are counted).
MAX_EXAMPLES: Final = 20


class TimestampHistoryError(PercolakeError, ValueError):
    """A malformed timestamp history; the message names the line."""


@dataclass(frozen=True, slots=True)
class TimestampCall:
    """One call that received a timestamp."""

    process: int | str
    #: The completion's position in the history (its ``index``, else its line number).
    index: int
    invoke_ns: int
    complete_ns: int
    ts: int
    node: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "index": self.index,
            "invoke_s": round(self.invoke_ns / 1e9, 6),
            "complete_s": round(self.complete_ns / 1e9, 6),
            "ts": self.ts,
            "node": self.node,
        }

    def describe(self) -> str:
        node = f" via {self.node}" if self.node else ""
        return (
            f"process {self.process}{node} (op {self.index}) got {self.ts}, "
            f"invoked {self.invoke_ns / 1e9:.6f} s, completed {self.complete_ns / 1e9:.6f} s"
        )


@dataclass(frozen=True, slots=True)
class TimestampViolation:
    """``later`` broke a property against ``earlier``."""

    type: str
    earlier: TimestampCall
    later: TimestampCall
    explanation: str

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "explanation": self.explanation,
            "earlier": self.earlier.to_json(),
            "later": self.later.to_json(),
        }


@dataclass(frozen=True, slots=True)
class TimestampReport:
    violations: tuple[TimestampViolation, ...]
    counts: dict[str, int]
    stats: dict[str, Any] = field(default_factory=dict)
    source: str = "<ops>"

    @property
    def valid(self) -> bool:
        return not self.counts

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "kind": "timestamps",
            "source": self.source,
            "violation_counts": self.counts,
            "violations": [v.to_json() for v in self.violations],
            "stats": self.stats,
        }

    def render_json(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def render_text(self) -> str:
        verdict = "VALID" if self.valid else "INVALID"
        lines = [
            f"{self.source}: timestamps history {verdict}",
            f"  {self.stats.get('calls_ok', 0)} calls received a timestamp "
            f"({self.stats.get('calls_not_ok', 0)} failed or unknown), "
            f"{self.stats.get('processes', 0)} processes",
        ]
        for kind, count in self.counts.items():
            lines.append(f"  {kind}: {count}")
        for violation in self.violations:
            lines.append(f"  - {violation.type}: {violation.explanation}")
        return "\n".join(lines) + "\n"


def timestamp_calls(ops: Iterable[Mapping[str, Any]]) -> tuple[list[TimestampCall], int, int]:
    """The calls that received a timestamp, the number of calls that did not, and the
    number of processes. Operations other than ``ts`` (the nemesis's) are skipped."""
    invoked: dict[Any, Mapping[str, Any]] = {}
    calls: list[TimestampCall] = []
    not_ok = 0
    processes: set[Any] = set()
    for line, op in enumerate(ops, start=1):
        if op.get("f") != TIMESTAMP_F or op.get("process") == "nemesis":
            continue
        kind, process, at = op.get("type"), op.get("process"), op.get("time")
        if not isinstance(at, int) or isinstance(at, bool):
            raise TimestampHistoryError(f"line {line}: time must be integer nanoseconds")
        if not isinstance(process, int | str) or isinstance(process, bool):
            raise TimestampHistoryError(f"line {line}: process must be an integer or a name")
        processes.add(process)
        if kind == "invoke":
            invoked[process] = op
            continue
        if kind not in ("ok", "fail", "info"):
            raise TimestampHistoryError(f"line {line}: unknown type {kind!r}")
        invoke = invoked.pop(process, None)
        if invoke is None:
            raise TimestampHistoryError(f"line {line}: {kind} of process {process} never invoked")
        if kind != "ok":
            not_ok += 1
            continue
        ts = op.get("value")
        if not isinstance(ts, int) or isinstance(ts, bool):
            raise TimestampHistoryError(f"line {line}: an ok call's value must be its timestamp")
        index = op.get("index")
        node = op.get("node")
        calls.append(
            TimestampCall(
                process=process,
                index=index if isinstance(index, int) else line,
                invoke_ns=int(invoke["time"]),
                complete_ns=at,
                ts=ts,
                node=str(node) if node is not None else None,
            )
        )
    return calls, not_ok, len(processes)


def check_timestamp_history(
    ops: Iterable[Mapping[str, Any]], *, source: str = "<ops>"
) -> TimestampReport:
    """Check uniqueness and real-time order of every received timestamp."""
    calls, not_ok, processes = timestamp_calls(ops)
    counts: dict[str, int] = {}
    examples: list[TimestampViolation] = []

    def flag(kind: str, earlier: TimestampCall, later: TimestampCall, why: str) -> None:
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= MAX_EXAMPLES:
            examples.append(TimestampViolation(kind, earlier, later, why))

    first_holder: dict[int, TimestampCall] = {}
    for call in sorted(calls, key=lambda c: (c.complete_ns, c.index)):
        holder = first_holder.setdefault(call.ts, call)
        if holder is not call:
            flag(
                DUPLICATE,
                holder,
                call,
                f"timestamp {call.ts} was received twice: {holder.describe()}; {call.describe()}",
            )

    by_complete = sorted(calls, key=lambda c: c.complete_ns)
    highest: TimestampCall | None = None
    stale_by_max = 0
    stale_by_node: dict[str, int] = {}
    i = 0
    for later in sorted(calls, key=lambda c: (c.invoke_ns, c.index)):
        while i < len(by_complete) and by_complete[i].complete_ns < later.invoke_ns:
            candidate = by_complete[i]
            if highest is None or candidate.ts > highest.ts:
                highest = candidate
            i += 1
        if highest is not None and highest.ts >= later.ts:
            stale_by_max = max(stale_by_max, highest.ts - later.ts)
            node = later.node or "-"
            stale_by_node[node] = stale_by_node.get(node, 0) + 1
            flag(
                REAL_TIME_ORDER,
                highest,
                later,
                f"{later.describe()}; but {highest.describe()}, which completed "
                f"{(later.invoke_ns - highest.complete_ns) / 1e6:.3f} ms before the later call "
                "began: a timestamp handed out after another must be above it",
            )
    stats: dict[str, Any] = {
        "calls_ok": len(calls),
        "calls_not_ok": not_ok,
        "processes": processes,
        "distinct_timestamps": len(first_holder),
        "calls_by_node": _by_node(calls),
    }
    if calls:
        stats["min_ts"] = min(c.ts for c in calls)
        stats["max_ts"] = max(c.ts for c in calls)
    if stale_by_max:
        stats["largest_step_back"] = stale_by_max
    if stale_by_node:
        stats["stale_calls_by_node"] = dict(sorted(stale_by_node.items()))
    return TimestampReport(tuple(examples), counts, stats, source)


def _by_node(calls: Iterable[TimestampCall]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for call in calls:
        key = call.node or "-"
        counted[key] = counted.get(key, 0) + 1
    return dict(sorted(counted.items()))


def _decode(path: str) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                op = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise TimestampHistoryError(f"line {number}: not valid JSON: {exc.msg}") from None
            if not isinstance(op, dict):
                raise TimestampHistoryError(f"line {number}: an operation must be an object")
            ops.append(op)
    return ops


def check_timestamp_file(path: str | os.PathLike[str]) -> TimestampReport:
    """Load and check a JSON-lines timestamp history."""
    source = os.fspath(path)
    return check_timestamp_history(_decode(source), source=source)


def is_timestamp_history(path: str | os.PathLike[str], *, lines: int = 50) -> bool:
    """Whether the file's first client operation is a ``ts`` call (a timestamps
    history rather than a list-append one). Unreadable content says no."""
    try:
        with open(os.fspath(path), encoding="utf-8") as source:
            for _, raw in zip(range(lines), source, strict=False):
                if not raw.strip():
                    continue
                try:
                    op = json.loads(raw)
                except json.JSONDecodeError:
                    return False
                if isinstance(op, dict) and op.get("process") != "nemesis":
                    return op.get("f") == TIMESTAMP_F
    except (OSError, UnicodeDecodeError):
        return False
    return False
