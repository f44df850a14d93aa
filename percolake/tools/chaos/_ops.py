"""One client operation: run it as a transaction and classify how it ended.

Jepsen's three outcomes: ``ok`` (committed, acknowledged), ``fail`` (definitely not
committed) and ``info`` (unknown: it may or may not have committed). The rule that
keeps the checks sound: anything that goes wrong before the commit is requested is a
``fail`` (nothing can commit a transaction that never asked to), and after it only
``TransactionAbortedError`` is a ``fail``; everything else there is ``info``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

from txn import Isolation, Manager, Transaction
from txn.errors import TransactionAbortedError

OpType: TypeAlias = Literal["ok", "fail", "info"]

#: Process number of the harness's own final read in the merged history.
FINAL_PROCESS: Final = 999_999


@dataclass(frozen=True, slots=True)
class Completion:
    type: OpType
    value: Any
    start_ts: int | None = None
    commit_ts: int | None = None
    error: str | None = None
    #: The server that answered, when the workload records it (timestamps: the
    #: replica a pinned client asks, or every replica).
    node: str | None = None


class Phase:
    """One byte in a shared file saying whether this client is inside a commit.

    The nemesis reads it to SIGKILL a client in the middle of a commit rather than
    at a random moment, where it would mostly hit reads. Before its first operation
    the client says it is ready; the harness starts the run's clock once all are.
    """

    IDLE: Final = b"-"
    COMMITTING: Final = b"C"
    #: Started and waiting for the run's clock (the harness's start file).
    READY: Final = b"R"

    def __init__(self, path: Path) -> None:
        if not path.exists() or path.stat().st_size != 1:
            path.write_bytes(self.IDLE)
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 1)

    def set(self, value: bytes) -> None:
        self._map[0:1] = value

    def get(self) -> bytes:
        return bytes(self._map[0:1])

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


def run_txn(
    manager: Manager,
    isolation: Isolation,
    body: Callable[[Transaction], Any],
    phase: Phase | None,
    failed_value: Any,
) -> Completion:
    """Begin, run ``body`` (reads and buffered writes), commit; classify the outcome.

    ``body`` returns the completed value (reads filled in); ``failed_value`` is what a
    ``fail`` or ``info`` completion records (the invocation's value).
    """
    try:
        tx = manager.begin(isolation)
    except Exception as exc:
        return Completion("fail", failed_value, error=describe(exc))
    start_ts: int = tx.start_ts
    try:
        value = body(tx)
        flush = getattr(tx, "flush", None)
        if flush is not None:
            flush()  # a remote write batch lost here is a failure before the commit
    except Exception as exc:
        with contextlib.suppress(Exception):  # nothing was committed either way
            tx.abort()
        return Completion("fail", failed_value, start_ts, error=describe(exc))
    if phase is not None:
        phase.set(Phase.COMMITTING)
    try:
        commit_ts: int = tx.commit()
    except TransactionAbortedError as exc:
        return Completion("fail", failed_value, start_ts, error=describe(exc))
    except Exception as exc:
        # CommitUnknownError, a lost reply, a gateway gone mid-commit: unknown outcome.
        return Completion("info", failed_value, start_ts, error=describe(exc))
    finally:
        if phase is not None:
            phase.set(Phase.IDLE)
    return Completion("ok", value, start_ts, commit_ts)
