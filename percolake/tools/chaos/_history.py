"""Client event files in, one history out.

Each client process appends its own JSON lines; :class:`EventTail` reads them while
the run goes on (for progress) and at the end. :func:`merge` orders every event by
the shared monotonic clock, closes the operation each crashed process left open with
an ``info`` completion at the moment it was killed, numbers the operations and adds the
fault injections as operations of the ``nemesis`` process, as Jepsen records them.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)


class EventTail:
    """Complete JSON lines of one file, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""
        self._lock = threading.Lock()  # the progress thread and the final merge both poll

    def poll(self) -> list[dict[str, Any]]:
        with self._lock:
            return self._poll()

    def _poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line (a SIGKILL mid-write)
        new = []
        for line in lines:
            if not line.strip():
                continue
            try:
                new.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s: skipping a malformed line %r", self.path, line[:200])
        self.events.extend(new)
        return new


def merge(
    tails: Iterable[EventTail],
    crashed: dict[int, int],
    end_ns: int,
) -> list[dict[str, Any]]:
    """Every client event in time order, each crashed process's open operation closed."""
    events: list[dict[str, Any]] = []
    for tail in tails:
        tail.poll()
        events.extend(tail.events)
        by_process: dict[int, dict[str, Any]] = {}
        for event in tail.events:
            if event["type"] == "invoke":
                by_process[event["process"]] = event
            else:
                by_process.pop(event["process"], None)
        for process, open_op in by_process.items():
            at = crashed.get(process, end_ns)
            events.append(
                {
                    **open_op,
                    "type": "info",
                    "time": max(at, open_op["time"]),
                    "error": "process crashed or was killed with this operation in flight",
                }
            )
    events.sort(key=lambda e: (e["time"], 0 if e["type"] != "invoke" else 1))
    return events


def nemesis_events(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fault injections and heals as Jepsen-style ``nemesis`` info operations."""
    events = []
    for fault in faults:
        what = f"{fault['kind']} {fault['target']}"
        events.append(
            {
                "type": "info",
                "process": "nemesis",
                "f": "start",
                "value": what,
                "time": int(fault["start_s"] * 1e9),
            }
        )
        events.append(
            {
                "type": "info",
                "process": "nemesis",
                "f": "stop",
                "value": what,
                "time": int(fault.get("end_s", fault["start_s"]) * 1e9),
            }
        )
    return events


def number(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every operation its ``index`` in history order (in place)."""
    for i, op in enumerate(ops):
        op["index"] = i
    return ops


def write_history(path: Path, ops: list[dict[str, Any]], *, gzipped: bool) -> Path:
    """JSON lines; ``.gz`` appended when compressed. Returns the file written."""
    target = path.with_name(path.name + ".gz") if gzipped else path
    out: IO[str]
    with (
        gzip.open(target, "wt", encoding="utf-8")
        if gzipped
        else target.open("w", encoding="utf-8") as out
    ):
        for op in ops:
            out.write(json.dumps(op, separators=(",", ":")) + "\n")
    return target
