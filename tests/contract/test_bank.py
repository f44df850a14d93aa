"""The bank workload: concurrent transfers; every snapshot must see the same total."""

from __future__ import annotations

import random
import threading
import time

import pytest

from txn import Isolation, Transaction, TransactionManager
from txn.errors import TransactionConflictError

pytestmark = pytest.mark.contract

ACCOUNTS = 8
INITIAL = 100
TABLE = "bank"
BAL = b"balance"


def account(i: int) -> bytes:
    return f"acct{i:03d}".encode()


def balances(tx: Transaction) -> dict[bytes, int]:
    return {row: int(value) for row, _, value in tx.scan(TABLE)}


@pytest.mark.parametrize("isolation", list(Isolation))
def test_concurrent_transfers_preserve_the_total(
    any_tm: TransactionManager, isolation: Isolation
) -> None:
    with any_tm.begin() as tx:
        for i in range(ACCOUNTS):
            tx.put(TABLE, account(i), BAL, str(INITIAL).encode())
    total = ACCOUNTS * INITIAL
    deadline = time.monotonic() + 20  # bound the workload, whatever the backend's speed
    errors: list[str] = []
    stats = {"transfers": 0, "conflicts": 0, "reads": 0}
    lock = threading.Lock()

    def transfer(tx: Transaction, src: bytes, dst: bytes, amount: int) -> None:
        got = tx.get_many(TABLE, [(src, BAL), (dst, BAL)])
        a, b = int(got[(src, BAL)]), int(got[(dst, BAL)])
        if a < amount:
            return
        tx.put(TABLE, src, BAL, str(a - amount).encode())
        tx.put(TABLE, dst, BAL, str(b + amount).encode())

    def transferer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            if time.monotonic() > deadline:
                return
            # A transfer after the last snapshot was read is seen by none of them, only
            # by the final total: stop then (once one landed), whatever the backend's
            # speed. Until then transfers go on through every read.
            if stats["transfers"] > 0 and not any(r.is_alive() for r in readers):
                return
            src, dst = rng.sample(range(ACCOUNTS), 2)
            try:
                with any_tm.begin(isolation) as tx:
                    transfer(tx, account(src), account(dst), rng.randint(1, 30))
                with lock:
                    stats["transfers"] += 1
            except TransactionConflictError:
                with lock:
                    stats["conflicts"] += 1

    def reader() -> None:
        for _ in range(40):
            if time.monotonic() > deadline:
                return
            tx = any_tm.begin(isolation)
            seen = balances(tx)
            tx.commit()  # read-only: never aborts
            with lock:
                stats["reads"] += 1
            if sum(seen.values()) != total or len(seen) != ACCOUNTS:
                errors.append(f"snapshot {tx.start_ts} saw {seen}")
            if any(v < 0 for v in seen.values()):
                errors.append(f"negative balance at {tx.start_ts}: {seen}")

    readers = [threading.Thread(target=reader) for _ in range(2)]
    # Readers first: a transferer that finds none alive stops.
    threads = readers + [threading.Thread(target=transferer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert stats["transfers"] > 0 and stats["reads"] > 0
    final = balances(any_tm.begin())
    assert sum(final.values()) == total
