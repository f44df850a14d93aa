"""The bank workload: transfers between accounts, full reads that must add up.

Every account is one cell. A transfer reads two balances and, when the source holds
enough, moves an amount between them; a full read reads every balance in one
transaction. Under snapshot isolation (and serializable) every full read must sum to
the initial total with no negative balance, and the final balances must be what the
acknowledged transfers (plus some subset of the ones whose outcome is unknown) make of
the initial ones.

With ``--pessimistic`` a transfer reads both balances with ``get_for_update`` instead
(issue 28): each cell is locked in the lock server, source first, then target, and read
at a fresh ``for_update_ts``. Transfers in opposite directions then lock in opposite
orders and deadlock; the victim (``DeadlockError``) is a failed operation, counted in
the check's stats with the locked reads. Locks are liveness only (rule S5): a lock
lost to a lock-service leader fault costs an abort, never a wrong balance, so the
checks are the same.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from percolake.tools.chaos._ops import FINAL_PROCESS, Completion, run_txn
from percolake.tools.chaos._workload import CheckResult, ClientContext, Workload
from txn import Isolation, Manager, Transaction
from txn.errors import DeadlockError

TABLE = "chaos.bank"
COLUMN = b"balance"
#: Exact accounting tries every subset of the transfers with an unknown outcome.
MAX_UNKNOWN_FOR_ACCOUNTING = 14
MAX_AMOUNT = 5
#: How a deadlock victim's failed transfer starts its error (``_ops.describe``).
DEADLOCK_ERROR = f"{DeadlockError.__name__}:"


def _row(account: int) -> bytes:
    return f"acct-{account:03d}".encode()


class Bank(Workload):
    name = "bank"
    history_name = "bank.jsonl"

    @property
    def total(self) -> int:
        return self.config.accounts * self.config.initial_balance

    def generate(
        self, rng: random.Random, elapsed_s: float, process: int, counter: int
    ) -> tuple[str, Any]:
        if rng.random() < 0.3:
            return "read", None
        source, target = rng.sample(range(self.config.accounts), 2)
        return "transfer", {"from": source, "to": target, "amount": rng.randint(1, MAX_AMOUNT)}

    def execute(self, ctx: ClientContext, f: str, value: Any) -> Completion:
        if f == "read":
            return run_txn(ctx.txns, ctx.isolation, self._read_all, ctx.phase, value)

        pessimistic = self.config.pessimistic

        def transfer(tx: Transaction) -> dict[str, Any]:
            cells = [(_row(value["from"]), COLUMN), (_row(value["to"]), COLUMN)]
            if pessimistic:
                # In the transfer's own order (source first), not sorted: opposite
                # transfers then wait for each other, and the lock server must pick a
                # victim.
                raw = [tx.get_for_update(TABLE, row, column) for row, column in cells]
            else:
                got = tx.get_many(TABLE, cells)
                raw = [got.get(c) for c in cells]
            balances = [None if b is None else int(b) for b in raw]
            source, target = balances
            applied = source is not None and target is not None and source >= value["amount"]
            if applied:
                assert source is not None and target is not None
                tx.put(TABLE, cells[0][0], COLUMN, str(source - value["amount"]).encode())
                tx.put(TABLE, cells[1][0], COLUMN, str(target + value["amount"]).encode())
            done = {**value, "read": balances, "applied": applied}
            if pessimistic:
                done["locked"] = len(cells)
            return done

        return run_txn(ctx.txns, ctx.isolation, transfer, ctx.phase, value)

    def _read_all(self, tx: Transaction) -> list[int | None]:
        cells = [(_row(a), COLUMN) for a in range(self.config.accounts)]
        got = tx.get_many(TABLE, cells)
        return [int(got[c]) if c in got else None for c in cells]

    # --- harness side --------------------------------------------------------------

    def setup(self, manager: Manager, warehouse: str) -> None:
        tx = manager.begin(Isolation.SNAPSHOT)
        balance = str(self.config.initial_balance).encode()
        for account in range(self.config.accounts):
            tx.put(TABLE, _row(account), COLUMN, balance)
        tx.commit()

    def final_read(
        self, manager: Manager, ops: list[dict[str, Any]], warehouse: str
    ) -> list[dict[str, Any]]:
        tx = manager.begin(Isolation.SNAPSHOT)
        balances = self._read_all(tx)
        commit_ts = tx.commit()
        invoke = {"type": "invoke", "process": FINAL_PROCESS, "f": "read", "value": None}
        return [
            invoke,
            {
                **invoke,
                "type": "ok",
                "value": balances,
                "start_ts": tx.start_ts,
                "commit_ts": commit_ts,
            },
        ]

    def check(self, ops: list[dict[str, Any]]) -> list[CheckResult]:
        reads = CheckResult("bank reads")
        accounting = CheckResult("bank final balances")
        initial = [self.config.initial_balance] * self.config.accounts
        delta = [0] * self.config.accounts
        unknown: list[dict[str, Any]] = []
        invoked: dict[int, dict[str, Any]] = {}
        final: list[int | None] | None = None
        checked_reads = 0
        locked_reads = 0
        deadlock_victims = 0
        for op in ops:
            if op["type"] == "invoke":
                invoked[op["process"]] = op
                continue
            invoke = invoked.pop(op["process"], op)
            if op["f"] == "read" and op["type"] == "ok":
                checked_reads += 1
                self._check_balances(reads, op, op["value"])
                if op["process"] == FINAL_PROCESS:
                    final = op["value"]
            elif op["f"] == "transfer":
                if op["type"] == "ok":
                    done = op["value"]
                    if any(b is not None and b < 0 for b in done["read"]):
                        self._flag(reads, op, "negative-balance", f"transfer read {done['read']}")
                    if done["applied"]:
                        delta[done["from"]] -= done["amount"]
                        delta[done["to"]] += done["amount"]
                    locked_reads += done.get("locked", 0)
                elif op["type"] == "info":
                    unknown.append(invoke["value"])
                elif str(op.get("error", "")).startswith(DEADLOCK_ERROR):
                    deadlock_victims += 1
        reads.stats.update(checked_reads=checked_reads, total=self.total)
        # What the pessimistic mode did: cells that acknowledged transfers read locked,
        # and transfers aborted as deadlock victims.
        reads.stats.update(
            pessimistic=self.config.pessimistic,
            locked_reads=locked_reads,
            deadlock_victims=deadlock_victims,
        )
        self._check_accounting(accounting, initial, delta, unknown, final)
        return [reads, accounting]

    def _check_balances(self, result: CheckResult, op: dict[str, Any], balances: Any) -> None:
        if any(b is None for b in balances):
            self._flag(result, op, "missing-account", f"read {balances}")
        elif sum(balances) != self.total:
            self._flag(
                result,
                op,
                "wrong-total",
                f"balances {balances} sum to {sum(balances)}, not {self.total}",
            )
        elif any(b < 0 for b in balances):
            self._flag(result, op, "negative-balance", f"read {balances}")

    @staticmethod
    def _flag(result: CheckResult, op: dict[str, Any], kind: str, explanation: str) -> None:
        result.anomalies.append(
            {
                "check": result.name,
                "type": kind,
                "explanation": f"process {op['process']} at index {op.get('index')}: "
                + explanation,
                "start_ts": op.get("start_ts"),
                "commit_ts": op.get("commit_ts"),
            }
        )

    def _check_accounting(
        self,
        result: CheckResult,
        initial: list[int],
        delta: list[int],
        unknown: list[dict[str, Any]],
        final: list[int | None] | None,
    ) -> None:
        result.stats.update(unknown_transfers=len(unknown))
        if final is None or any(b is None for b in final):
            result.anomalies.append(
                {"check": result.name, "type": "no-final-read", "explanation": f"{final}"}
            )
            return
        expected = [i + d for i, d in zip(initial, delta, strict=True)]
        if len(unknown) > MAX_UNKNOWN_FOR_ACCOUNTING:
            result.stats["exact"] = False
            result.stats["note"] = (
                f"{len(unknown)} transfers have an unknown outcome: too many subsets to try; "
                "only the total is checked"
            )
            return
        result.stats["exact"] = True
        for size in range(len(unknown) + 1):
            for subset in itertools.combinations(unknown, size):
                candidate = list(expected)
                for t in subset:
                    candidate[t["from"]] -= t["amount"]
                    candidate[t["to"]] += t["amount"]
                if candidate == final:
                    result.stats["unknown_applied"] = size
                    return
        result.anomalies.append(
            {
                "check": result.name,
                "type": "lost-or-phantom-transfer",
                "explanation": f"final balances {final} are not the initial ones plus the "
                f"{len(unknown)} unknown and acknowledged transfers (expected {expected} "
                "plus some of the unknown)",
            }
        )
