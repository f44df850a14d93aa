"""Synthetic list-append histories for tests and benchmarks.

:func:`simulate` runs concurrent clients against a small multi-version store that
implements percolake's rules (snapshot reads at ``start_ts``, first-committer-wins on
written keys, and for serializable read validation up to ``commit_ts``), and records
the history in the JSON-lines format ``percolake check`` reads. A history it produces
without deliberate bugs is valid under the isolation level it simulated; the ``*_bug_*``
knobs break the rules on purpose to produce anomalies.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class Workload:
    """What to simulate. Fractions are per transaction, in [0, 1]."""

    txns: int = 1000
    processes: int = 8
    # Like Elle's generator: this many keys are live at once, and a key that received
    # max_writes_per_key appends is retired for a fresh one, so reads stay short.
    active_keys: int = 8
    max_writes_per_key: int = 32
    min_txn_length: int = 1
    max_txn_length: int = 4
    read_fraction: float = 0.5
    isolation: Literal["snapshot-isolation", "serializable"] = "snapshot-isolation"
    abort_fraction: float = 0.0
    # Outcome unknown to the client; half of these transactions did commit.
    info_fraction: float = 0.0
    record_timestamps: bool = True
    # Deliberate bugs, for anomaly tests and benchmarks.
    lost_update_bug_fraction: float = 0.0
    stale_read_bug_fraction: float = 0.0
    seed: int = 0


@dataclass(slots=True)
class _Pending:
    start_ts: int
    invoke: list[list[object]]


@dataclass(slots=True)
class _Store:
    """Per key: the elements of its list in commit order, and each one's commit_ts."""

    elements: dict[int, list[int]] = field(default_factory=dict)
    commits: dict[int, list[int]] = field(default_factory=dict)

    def read(self, key: int, snapshot_ts: int) -> list[int]:
        commits = self.commits.get(key, [])
        return self.elements.get(key, [])[: bisect.bisect_left(commits, snapshot_ts)]

    def last_commit_ts(self, key: int) -> int:
        commits = self.commits.get(key)
        return commits[-1] if commits else 0

    def append(self, key: int, element: int, commit_ts: int) -> None:
        self.elements.setdefault(key, []).append(element)
        self.commits.setdefault(key, []).append(commit_ts)


class _Simulation:
    def __init__(self, workload: Workload) -> None:
        self.w = workload
        self.rng = random.Random(workload.seed)
        self.clock = itertools.count(1)
        self.store = _Store()
        self.ops: list[dict[str, object]] = []
        self.keys = list(range(workload.active_keys))
        self.next_key = workload.active_keys
        self.writes: dict[int, int] = {}

    def run(self) -> list[dict[str, object]]:
        pending: dict[int, _Pending] = {}
        started = completed = 0
        while completed < self.w.txns:
            if started < self.w.txns:
                process = self.rng.randrange(self.w.processes)
            else:
                process = self.rng.choice(sorted(pending))
            if process in pending:
                self.complete(process, pending.pop(process))
                completed += 1
            else:
                pending[process] = self.invoke(process)
                started += 1
        return self.ops

    def record(self, op_type: str, process: int, value: object, **extra: object) -> None:
        op: dict[str, object] = {
            "index": len(self.ops),
            "type": op_type,
            "process": process,
            "f": "txn",
            "value": value,
        }
        if self.w.record_timestamps:
            op.update({k: v for k, v in extra.items() if v is not None})
        self.ops.append(op)

    def invoke(self, process: int) -> _Pending:
        mops: list[list[object]] = []
        for _ in range(self.rng.randint(self.w.min_txn_length, self.w.max_txn_length)):
            slot = self.rng.randrange(len(self.keys))
            key = self.keys[slot]
            if self.rng.random() < self.w.read_fraction:
                mops.append(["r", key, None])
                continue
            count = self.writes.get(key, 0) + 1
            self.writes[key] = count
            mops.append(["append", key, count])
            if count >= self.w.max_writes_per_key:
                self.keys[slot] = self.next_key
                self.next_key += 1
        self.record("invoke", process, mops)
        return _Pending(start_ts=next(self.clock), invoke=mops)

    def complete(self, process: int, txn: _Pending) -> None:
        w, rng, store = self.w, self.rng, self.store
        snapshot_ts = txn.start_ts
        if rng.random() < w.stale_read_bug_fraction:
            snapshot_ts = max(1, txn.start_ts - rng.randint(1, 4 * w.processes))
        local: dict[int, list[int]] = {}
        completion: list[list[object]] = []
        written: list[tuple[int, int]] = []
        read_keys: set[int] = set()
        for f, key, arg in txn.invoke:
            assert isinstance(key, int)
            state = local.get(key)
            if state is None:
                state = local[key] = store.read(key, snapshot_ts)
            if f == "r":
                read_keys.add(key)
                completion.append(["r", key, list(state)])
            else:
                assert isinstance(arg, int)
                state.append(arg)
                written.append((key, arg))
                completion.append(["append", key, arg])
        written_keys = {key for key, _ in written}
        conflict = any(store.last_commit_ts(k) > txn.start_ts for k in written_keys)
        if conflict and rng.random() < w.lost_update_bug_fraction:
            conflict = False
        if written and w.isolation == "serializable":
            # Read-only transactions need no validation: their snapshot is a prefix of
            # the commit order.
            conflict = conflict or any(store.last_commit_ts(k) > txn.start_ts for k in read_keys)
        if conflict or rng.random() < w.abort_fraction:
            self.record("fail", process, txn.invoke, start_ts=txn.start_ts)
            return
        unknown = rng.random() < w.info_fraction
        if unknown and rng.random() < 0.5:
            self.record("info", process, txn.invoke)
            return
        commit_ts = next(self.clock) if written else None
        for key, element in written:
            assert commit_ts is not None
            store.append(key, element, commit_ts)
        if unknown:
            self.record("info", process, txn.invoke)
        else:
            self.record("ok", process, completion, start_ts=txn.start_ts, commit_ts=commit_ts)


def simulate(workload: Workload) -> list[dict[str, object]]:
    """Run ``workload`` and return its history as decoded JSON operations."""
    return _Simulation(workload).run()


def write_history(ops: Iterable[Mapping[str, object]], path: str | os.PathLike[str]) -> None:
    """Write operations as JSON lines."""
    with open(path, "w", encoding="utf-8") as out:
        for op in ops:
            out.write(json.dumps(op, separators=(",", ":")))
            out.write("\n")
