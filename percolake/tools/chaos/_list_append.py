"""Elle's list-append workload over a few hot keys.

Each key is one cell holding a JSON list; a transaction is one to ``max_txn_len``
micro-operations, each a read of a key or an append of a value unique to that key.
Each client draws keys from its ``active_keys`` hot keys and retires a key for the next
fresh one once it sees that key's list reach ``max_list_len``, as Elle does: lists stay
short (cheap reads, small histories, fast checking) while every key is contended. All
clients start on the same keys and retire them in the same order, so they stay
together without talking to each other. The history is checked by ``percolake.tools.checker``
under the run's model, and a final read after the faults are healed must contain every
acknowledged append and no append that definitely failed.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

from percolake.tools.chaos._ops import FINAL_PROCESS, Completion, run_txn
from percolake.tools.chaos._workload import CheckResult, ClientContext, Workload
from percolake.tools.checker import check_history
from txn import Isolation, Manager, Transaction

TABLE = "chaos.la"
COLUMN = b"v"
#: Appended values are ``process * VALUES_PER_PROCESS + n``: unique per key across the run.
VALUES_PER_PROCESS = 10_000_000
_FINAL_READ_BATCH = 500


def _row(key: int) -> bytes:
    return str(key).encode()


def _decode(raw: bytes | None) -> list[int]:
    if raw is None:
        return []
    values = json.loads(raw)
    assert isinstance(values, list)
    return [int(v) for v in values]


class ListAppend(Workload):
    name = "list-append"
    history_name = "history.jsonl"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._values: Iterator[int] = iter(())
        self._active = list(range(self.config.active_keys))
        self._next_key = self.config.active_keys

    def _observe(self, key: int, length: int) -> None:
        """Retire ``key`` for a fresh one once its list is long enough."""
        if length >= self.config.max_list_len and key in self._active:
            self._active.remove(key)
            self._active.append(self._next_key)
            self._next_key += 1

    def open_client(self, ctx: ClientContext) -> None:
        self._values = itertools.count(ctx.process * VALUES_PER_PROCESS)

    def generate(
        self, rng: random.Random, elapsed_s: float, process: int, counter: int
    ) -> tuple[str, Any]:
        mops: list[list[Any]] = []
        for _ in range(rng.randint(1, self.config.max_txn_len)):
            key = rng.choice(self._active)
            if rng.random() < 0.5:
                mops.append(["r", key, None])
            else:
                mops.append(["append", key, next(self._values)])
        return "txn", mops

    def execute(self, ctx: ClientContext, f: str, value: Any) -> Completion:
        def body(tx: Transaction) -> list[list[Any]]:
            done: list[list[Any]] = []
            for kind, key, arg in value:
                current = _decode(tx.get(TABLE, _row(key), COLUMN))
                self._observe(key, len(current))
                if kind == "r":
                    done.append(["r", key, current])
                else:
                    tx.put(TABLE, _row(key), COLUMN, json.dumps([*current, arg]).encode())
                    done.append(["append", key, arg])
            return done

        return run_txn(ctx.txns, ctx.isolation, body, ctx.phase, value)

    # --- harness side --------------------------------------------------------------

    def final_read(
        self, manager: Manager, ops: list[dict[str, Any]], warehouse: str
    ) -> list[dict[str, Any]]:
        keys = sorted({mop[1] for op in ops if op["type"] == "invoke" for mop in op["value"]})
        tx = manager.begin(Isolation.SNAPSHOT)
        lists: dict[int, list[int]] = {}
        for i in range(0, len(keys), _FINAL_READ_BATCH):
            batch = keys[i : i + _FINAL_READ_BATCH]
            got = tx.get_many(TABLE, [(_row(k), COLUMN) for k in batch])
            for k in batch:
                lists[k] = _decode(got.get((_row(k), COLUMN)))
        commit_ts = tx.commit()
        invoke = {"type": "invoke", "process": FINAL_PROCESS, "f": "txn"}
        return [
            {**invoke, "value": [["r", k, None] for k in keys]},
            {
                **invoke,
                "type": "ok",
                "value": [["r", k, lists[k]] for k in keys],
                "start_ts": tx.start_ts,
                "commit_ts": commit_ts,
            },
        ]

    def check(self, ops: list[dict[str, Any]]) -> list[CheckResult]:
        model = "serializable" if self.config.isolation == "serializable" else "snapshot-isolation"
        report = check_history(ops, model)
        elle = CheckResult(f"list-append {model}", stats=dict(report.stats))
        elle.stats["anomaly_counts"] = dict(report.anomaly_counts)
        elle.stats["allowed_anomaly_counts"] = dict(report.allowed_counts)
        for anomaly in report.anomalies:
            elle.anomalies.append({"check": elle.name, **anomaly.to_json()})
        return [elle, _final_state_check(ops)]


def _final_state_check(ops: list[dict[str, Any]]) -> CheckResult:
    """Every acknowledged append is in the final read; no definitely failed one is."""
    result = CheckResult("list-append final state")
    final = next((op for op in ops if op["process"] == FINAL_PROCESS and op["type"] == "ok"), None)
    if final is None:
        result.anomalies.append({"check": result.name, "type": "no-final-read"})
        return result
    present = {(mop[1], v) for mop in final["value"] for v in mop[2]}
    invoked: dict[int, list[Any]] = {}
    acknowledged = failed = 0
    for op in ops:
        if op["process"] == FINAL_PROCESS:
            continue
        if op["type"] == "invoke":
            invoked[op["process"]] = op["value"]
            continue
        appends = [(m[1], m[2]) for m in invoked.pop(op["process"], []) if m[0] == "append"]
        for key, value in appends:
            if op["type"] == "ok":
                acknowledged += 1
                if (key, value) not in present:
                    result.anomalies.append(
                        {
                            "check": result.name,
                            "type": "lost-acknowledged-write",
                            "explanation": f"append of {value} to key {key} was acknowledged "
                            f"(commit_ts {op.get('commit_ts')}) but the final read lacks it",
                            "key": key,
                            "value": value,
                        }
                    )
            elif op["type"] == "fail":
                failed += 1
                if (key, value) in present:
                    result.anomalies.append(
                        {
                            "check": result.name,
                            "type": "failed-write-visible",
                            "explanation": f"append of {value} to key {key} failed "
                            f"({op.get('error')}) yet the final read holds it",
                            "key": key,
                            "value": value,
                        }
                    )
    result.stats.update(
        acknowledged_appends=acknowledged,
        failed_appends=failed,
        final_keys=len(final["value"]),
        final_elements=len(present),
    )
    return result
