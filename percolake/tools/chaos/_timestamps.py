"""The timestamps workload: clients ask the oracle for one timestamp at a time.

In the style of AtlasDB TimeLock's Jepsen test. Every client process calls
``TimestampService.GetTimestamps(count=1)`` over and over, each call bounded by
``ts_call_timeout_s``, and records its invocation and completion (the timestamp, or
the failure). With replicas, even client slots are pinned to one replica's address
each, so that a replica that wakes up from a pause is asked directly, before anyone
tells it that another replica leads now; odd slots are given every replica's address
and fail over by themselves. A call that received no timestamp is ``fail`` when the
service said it is unavailable (no leader, oracle fenced: nothing was handed out to
this call) and ``info`` otherwise (a deadline: it may have been served).

The check (:func:`percolake.tools.checker.check_timestamp_history`): every timestamp unique,
and for any two received calls a, b with ``a.complete < b.invoke``, ``ts(a) < ts(b)``.
The final read asks for one more timestamp after every fault has healed: it must be
above all of them.
"""

from __future__ import annotations

import random
from typing import Any

import grpc

from percolake.tools.chaos._ops import FINAL_PROCESS, Completion, OpType, describe
from percolake.tools.chaos._workload import CheckResult, ClientContext, Workload
from percolake.tools.checker import check_timestamp_history
from txn import Isolation, Manager
from wire import errors
from wire.channels import Connection, call
from wire.error_codes import RpcError
from wire.v1 import timestamp_pb2 as pb
from wire.v1 import timestamp_pb2_grpc as pb_grpc

F = "ts"


class Timestamps(Workload):
    name = "timestamps"
    history_name = "timestamps.jsonl"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conn: Connection | None = None
        self._stub: pb_grpc.TimestampServiceStub | None = None
        self._node = ""

    # --- client side ---------------------------------------------------------------

    def open_client(self, ctx: ClientContext) -> None:
        if not ctx.tso:
            raise ValueError("the timestamps workload needs the oracle's address (--tso)")
        self._conn = Connection(ctx.tso)
        self._stub = pb_grpc.TimestampServiceStub(self._conn.channel)
        # A pinned client names its replica; one given every replica says "any".
        self._node = ctx.tso if "," not in ctx.tso else "any"

    def close_client(self, ctx: ClientContext) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = self._stub = None

    def generate(
        self, rng: random.Random, elapsed_s: float, process: int, counter: int
    ) -> tuple[str, Any]:
        return F, None

    def execute(self, ctx: ClientContext, f: str, value: Any) -> Completion:
        assert self._conn is not None and self._stub is not None
        try:
            got = call(
                self._stub.GetTimestamps,
                pb.GetTimestampsRequest(count=1),
                self._conn,
                self.config.ts_call_timeout_s,
            )
        except errors.OracleFencedError as exc:
            return Completion("fail", None, error=describe(exc), node=self._node)
        except RpcError as exc:
            kind: OpType = "fail" if exc.code is grpc.StatusCode.UNAVAILABLE else "info"
            return Completion(kind, None, error=describe(exc), node=self._node)
        except Exception as exc:
            return Completion("info", None, error=describe(exc), node=self._node)
        if got.count != 1:
            return Completion("info", None, error=f"asked for 1, got {got.count}")
        return Completion("ok", int(got.first), node=self._node)

    # --- harness side --------------------------------------------------------------

    def final_read(
        self, manager: Manager, ops: list[dict[str, Any]], warehouse: str
    ) -> list[dict[str, Any]]:
        """One more timestamp once every fault healed (a transaction's start)."""
        tx = manager.begin(Isolation.SNAPSHOT)
        ts = int(tx.start_ts)
        tx.abort()
        invoke = {"type": "invoke", "process": FINAL_PROCESS, "f": F, "value": None}
        return [invoke, {**invoke, "type": "ok", "value": ts, "node": "final"}]

    def check(self, ops: list[dict[str, Any]]) -> list[CheckResult]:
        report = check_timestamp_history(ops)
        result = CheckResult("timestamps", stats=dict(report.stats))
        result.stats["violation_counts"] = dict(report.counts)
        for violation in report.violations:
            result.anomalies.append({"check": result.name, **violation.to_json()})
        return [result]
