"""What the protocol needs from the oracle and the lock server, embedded or remote."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol

from lockserver import LockToken


class TimestampSource(Protocol):
    def next_timestamp(self) -> int:
        """A fresh timestamp, above every timestamp handed out before this call."""
        ...


class LockService(Protocol):
    def lock(
        self,
        descriptors: Iterable[bytes],
        owner: str,
        lease_ms: int,
        wait_timeout_ms: int = 0,
        priority: int | None = None,
    ) -> LockToken | None:
        """Lock every descriptor or none; ``None`` on timeout. Waiters with a
        ``priority`` are granted lowest first (transactions pass their start timestamp:
        the oldest can still commit what a younger one cannot), others in arrival order."""
        ...

    def refresh(self, token: LockToken, lease_ms: int | None = None) -> bool: ...

    def unlock(self, token: LockToken) -> bool: ...

    def wait_until_released(self, descriptors: Iterable[bytes], timeout_ms: int) -> bool: ...


#: Descriptors longer than this are replaced by a digest, so that every cell a store
#: can hold (row + column up to 64 KiB) can be locked within the lock server's
#: descriptor limit. Locks only serve liveness (S5): even a collision would only make
#: two commits wait for each other, never an anomaly.
_LONGEST_PLAIN_DESCRIPTOR = 256


def cell_lock(table: str, row: bytes, column: bytes) -> bytes:
    """Lock descriptor of a cell; length prefixes keep distinct cells distinct."""
    t = table.encode()
    plain = b"c" + len(t).to_bytes(1, "big") + t + len(row).to_bytes(4, "big") + row + column
    if len(plain) <= _LONGEST_PLAIN_DESCRIPTOR:
        return plain
    return b"h" + hashlib.sha256(plain).digest()


def commit_lock(start_ts: int) -> bytes:
    """Lock descriptor a transaction holds while it commits; readers wait on it."""
    return b"t" + start_ts.to_bytes(8, "big")
