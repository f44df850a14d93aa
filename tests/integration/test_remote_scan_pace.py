"""A remote scan read at the caller's pace (the CI failure of 2026-11-27 in the remote
state machine: ``ServiceUnavailableError: Stream removed (Deadline Exceeded)``).

A ``Scan`` call's deadline covered the whole stream, the caller's time between rows
included, so a scan consumed more slowly than ``timeout_s`` died although the gateway
had answered at once. A scan now goes on in a new call from the last cell handed over.
"""

from __future__ import annotations

import time

import pytest

from tests.servers import ServerProcess
from txn import Isolation, TransactionManager
from txn.errors import TransactionConflictError

pytestmark = pytest.mark.integration

#: The client's call deadline; the caller pauses longer than this between rows.
DEADLINE_S = 0.5
PAUSE_S = 0.8


def _cells(prefix: str, rows: int) -> list[tuple[bytes, bytes, bytes]]:
    return [
        (f"{prefix}{i:04d}".encode(), column, f"{i}:{column.decode()}".encode())
        for i in range(rows)
        for column in (b"a", b"b")
    ]


def test_a_scan_consumed_slower_than_the_deadline_returns_every_cell_once_in_order(
    sqlite_gateway: ServerProcess,
) -> None:
    """Pauses longer than the call deadline, after the first cell, between a row's two
    columns and near the end: every cell comes back once, in order.

    Fails on the code before this fix with ``ServiceUnavailableError: Stream removed
    (Deadline Exceeded)`` at the first pull after the first pause."""
    cells = _cells("pace", 600)
    setup = TransactionManager.remote(sqlite_gateway.address)
    try:
        with setup.begin() as tx:
            for row, column, value in cells:
                tx.put("pace", row, column, value)
            tx.commit()
    finally:
        setup.close()
    tm = TransactionManager.remote(sqlite_gateway.address, timeout_s=DEADLINE_S)
    try:
        with tm.begin() as tx:
            got = []
            for n, cell in enumerate(tx.scan("pace")):
                got.append(cell)
                if n in (0, 301, len(cells) - 3):  # 301: row 150's column a, before its b
                    time.sleep(PAUSE_S)
            assert got == cells
            tx.commit()
    finally:
        tm.close()


def test_a_resumed_serializable_scan_is_validated_over_what_the_first_call_read(
    sqlite_gateway: ServerProcess,
) -> None:
    """A SERIALIZABLE transaction scans a range, pausing past the deadline halfway (the
    scan goes on in a second call), and writes. A row another transaction changed in
    the half the first call read makes its commit fail; a change outside the range
    does not."""
    cells = _cells("ser", 40)
    tm = TransactionManager.remote(sqlite_gateway.address)
    slow = TransactionManager.remote(sqlite_gateway.address, timeout_s=DEADLINE_S)
    try:
        with tm.begin() as tx:
            for row, column, value in cells:
                tx.put("ser", row, column, value)
            tx.put("ser", b"zzz", b"a", b"outside")
            tx.commit()
        for changed, fails in ((b"zzz", False), (b"ser0003", True)):
            reader = slow.begin(Isolation.SERIALIZABLE)
            seen = []
            for n, cell in enumerate(reader.scan("ser", b"ser", b"ser9")):
                seen.append(cell)
                if n == len(cells) // 2:
                    time.sleep(PAUSE_S)
            assert seen == cells
            with tm.begin() as writer:
                writer.put("ser", changed, b"a", b"changed")
                writer.commit()
            reader.put("ser", b"result", b"a", str(len(seen)).encode())
            if fails:
                with pytest.raises(TransactionConflictError):
                    reader.commit()
            else:
                assert reader.commit() > reader.start_ts
    finally:
        tm.close()
        slow.close()
