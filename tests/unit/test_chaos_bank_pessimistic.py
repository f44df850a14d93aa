"""The chaos bank workload's pessimistic mode (issue 28): the option, the transfer that
locks both balances with ``get_for_update``, and the check's counts of locked reads and
deadlock victims. The run itself, under lock-service leader faults, is in
``tests/chaos/test_chaos.py``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from percolake.tools.chaos._bank import COLUMN, TABLE, Bank
from percolake.tools.chaos._config import RunConfig
from percolake.tools.chaos._ops import FINAL_PROCESS
from percolake.tools.chaos._run import replay_command
from percolake.tools.chaos._workload import ClientContext
from percolake.tools.chaos.cli import add_chaos_commands, config_from_args
from txn import Isolation, TransactionConfig, TransactionManager
from wire import metrics

pytestmark = pytest.mark.unit


def test_pessimistic_is_a_bank_option_kept_in_the_config_and_the_replay(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_chaos_commands(parser.add_subparsers(dest="command"))
    run = ["chaos", "run", "--workload", "bank", "--seed", "1", "--out", str(tmp_path)]
    args = parser.parse_args([*run, "--pessimistic"])
    config = config_from_args(args)
    assert config.pessimistic is True
    assert "--pessimistic" in replay_command(config)
    config.dump(tmp_path / "run-config.json")
    assert RunConfig.load(tmp_path / "run-config.json").pessimistic is True
    assert config_from_args(parser.parse_args(run)).pessimistic is False
    with pytest.raises(ValueError, match="--pessimistic applies to --workload bank only"):
        RunConfig(workload="list-append", out_dir=tmp_path, pessimistic=True)


def test_a_pessimistic_transfer_locks_both_balances_and_moves_the_amount(
    tmp_path: Path,
) -> None:
    config = RunConfig(workload="bank", out_dir=tmp_path, accounts=2, pessimistic=True)
    bank = Bank(config)
    with TransactionManager.embedded(
        f"sqlite:///{tmp_path}/b.db", config=TransactionConfig(lock_wait_ms=1_000)
    ) as tm:
        bank.setup(tm, "")
        ctx = ClientContext(manager=tm, isolation=Isolation.SERIALIZABLE, process=0, phase=None)
        before = metrics.PESSIMISTIC_LOCKS._value.get()
        done = bank.execute(ctx, "transfer", {"from": 0, "to": 1, "amount": 3})
        # Two cells locked by get_for_update, read under the locks, then written.
        assert metrics.PESSIMISTIC_LOCKS._value.get() == before + 2
        assert done.type == "ok", done
        assert done.value == {
            "from": 0,
            "to": 1,
            "amount": 3,
            "read": [100, 100],
            "applied": True,
            "locked": 2,
        }
        with tm.begin() as tx:
            assert tx.get(TABLE, b"acct-000", COLUMN) == b"97"
            assert tx.get(TABLE, b"acct-001", COLUMN) == b"103"


def _op(process: int, kind: str, f: str, value: Any, **extra: Any) -> list[dict[str, Any]]:
    invoke = {"type": "invoke", "process": process, "f": f, "value": value}
    return [invoke, {**invoke, "type": kind, **extra}]


def test_the_check_counts_locked_reads_and_deadlock_victims(tmp_path: Path) -> None:
    bank = Bank(RunConfig(workload="bank", out_dir=tmp_path, accounts=2, pessimistic=True))
    moved = {"from": 0, "to": 1, "amount": 3}
    ops = [
        *_op(1, "ok", "transfer", {**moved, "read": [100, 100], "applied": True, "locked": 2}),
        *_op(
            2,
            "fail",
            "transfer",
            {"from": 1, "to": 0, "amount": 1},
            error="DeadlockError: deadlock: 7 waits for 5 ...",
        ),
        *_op(3, "fail", "transfer", moved, error="TransactionConflictError: lock-wait timeout"),
        *_op(FINAL_PROCESS, "ok", "read", [97, 103]),
    ]
    reads, accounting = bank.check(ops)
    assert reads.valid and accounting.valid, (reads.anomalies, accounting.anomalies)
    assert reads.stats["pessimistic"] is True
    assert reads.stats["locked_reads"] == 2
    assert reads.stats["deadlock_victims"] == 1
    # A victim's transfer did not happen: counting it would leave the balances wrong.
    wrong = [*ops[:-2], *_op(FINAL_PROCESS, "ok", "read", [98, 102])]
    assert not bank.check(wrong)[1].valid
