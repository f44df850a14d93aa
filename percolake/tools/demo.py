"""The demo behind ``make run``: the transaction layer on the embedded SQLite store.

It shows what percolake promises, on a fresh store: concurrent transfers that never
lose money, first-committer-wins conflicts, a committer that "crashes" half-way
leaving nothing visible, snapshot reads that ignore later commits, and write skew
refused under SERIALIZABLE.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from pathlib import Path
from typing import TextIO

from lockserver import LockTable
from txn import Isolation, Transaction, TransactionManager
from txn import failpoints as fp
from txn.errors import TransactionConflictError

ACCOUNTS = 10
INITIAL = 1_000
TABLE = "accounts"
COLUMN = b"balance"


def _row(i: int) -> bytes:
    return f"acct-{i:02d}".encode()


def _total(tx: Transaction) -> tuple[int, int]:
    values = [int(v) for _, _, v in tx.scan(TABLE)]
    return len(values), sum(values)


def run_demo(workdir: Path, out: TextIO) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "demo.db"
    for leftover in workdir.glob("demo.db*"):
        leftover.unlink()
    url = f"sqlite:///{db}"

    def say(line: str = "") -> None:
        out.write(line + "\n")
        out.flush()

    say(f"percolake demo on {url}")
    with TransactionManager.embedded(url) as tm:
        with tm.begin() as tx:
            for i in range(ACCOUNTS):
                tx.put(TABLE, _row(i), COLUMN, str(INITIAL).encode())
        say(f"1. created {ACCOUNTS} accounts of {INITIAL} in one transaction")

        stats = {"ok": 0, "conflicts": 0, "bad_snapshots": 0, "snapshots": 0}
        lock = threading.Lock()

        def transfers(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(100):
                a, b = rng.sample(range(ACCOUNTS), 2)

                def move(tx: Transaction, a: int = a, b: int = b) -> None:
                    got = tx.get_many(TABLE, [(_row(a), COLUMN), (_row(b), COLUMN)])
                    amount = rng.randint(1, 50)
                    tx.put(
                        TABLE, _row(a), COLUMN, str(int(got[(_row(a), COLUMN)]) - amount).encode()
                    )
                    tx.put(
                        TABLE, _row(b), COLUMN, str(int(got[(_row(b), COLUMN)]) + amount).encode()
                    )

                try:
                    with tm.begin() as tx:
                        move(tx)
                    with lock:
                        stats["ok"] += 1
                except TransactionConflictError:
                    with lock:
                        stats["conflicts"] += 1

        def auditor() -> None:
            for _ in range(50):
                tx = tm.begin()
                count, total = _total(tx)
                tx.commit()
                with lock:
                    stats["snapshots"] += 1
                    if (count, total) != (ACCOUNTS, ACCOUNTS * INITIAL):
                        stats["bad_snapshots"] += 1

        started = time.monotonic()
        threads = [threading.Thread(target=transfers, args=(s,)) for s in range(4)]
        threads.append(threading.Thread(target=auditor))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        say(
            f"2. 4 threads ran 400 transfers in {elapsed:.2f}s: {stats['ok']} committed, "
            f"{stats['conflicts']} lost a write-write conflict (first committer wins)"
        )
        say(
            f"   an auditor took {stats['snapshots']} snapshots meanwhile; "
            f"{stats['bad_snapshots']} saw a total other than {ACCOUNTS * INITIAL}"
        )

        snapshot = tm.begin()
        crashed = tm.begin()
        for i in range(ACCOUNTS):
            crashed.put(TABLE, _row(i), COLUMN, b"0")
        tm.failpoints.enable(fp.AFTER_WRITE, fp.crash(), times=1)
        with contextlib.suppress(fp.SimulatedCrash):
            crashed.commit()
        tm.replace_locks(LockTable())  # the crashed committer's locks die with it
        count, total = _total(tm.begin())
        say(
            f"3. a committer crashed after writing all {ACCOUNTS} balances as 0: readers see "
            f"{count} accounts totalling {total} (nothing of it is visible)"
        )

        with tm.begin() as tx:
            tx.put(TABLE, _row(0), COLUMN, b"999999")
        count, total = _total(snapshot)
        say(
            f"4. a snapshot taken before a later commit still reads a total of {total}; "
            f"a new one reads {_total(tm.begin())[1]}"
        )

        outcomes = []
        for isolation in (Isolation.SNAPSHOT, Isolation.SERIALIZABLE):
            with tm.begin() as tx:
                tx.put("oncall", b"alice", b"on", b"1")
                tx.put("oncall", b"bob", b"on", b"1")
            t1, t2 = tm.begin(isolation), tm.begin(isolation)
            for tx, me in ((t1, b"alice"), (t2, b"bob")):
                on_call = sum(int(v) for _, _, v in tx.scan("oncall"))
                if on_call == 2:
                    tx.put("oncall", me, b"on", b"0")
            t1.commit()
            try:
                t2.commit()
                outcomes.append(f"{isolation.value}: both went off call (write skew)")
            except TransactionConflictError:
                outcomes.append(f"{isolation.value}: the second was refused")
        say("5. two doctors each leave the on-call rota if the other is on it:")
        for line in outcomes:
            say(f"   {line}")
    say("done.")
    return 0 if stats["bad_snapshots"] == 0 and total == ACCOUNTS * INITIAL else 1
