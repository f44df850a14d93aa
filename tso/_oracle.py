"""The timestamp oracle: strictly increasing timestamps with a persisted upper bound (S7)."""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

from storage_adapters import KVStore, StoreError

log = logging.getLogger(__name__)

#: System table and row that hold the oracle's persisted upper bound.
TSO_TABLE = "_tso"
BOUND_KEY = b"bound"

#: How many timestamps one bound extension reserves. Large enough that extensions
#: (one compare-and-set each) are rare at millions of timestamps per second; a
#: restart skips at most this many timestamps, which costs nothing.
DEFAULT_WINDOW = 1_000_000

#: Timestamps start here on a fresh store; 0 stays free as "before everything".
FIRST_TIMESTAMP = 1


class OracleFencedError(RuntimeError):
    """Another oracle took over the bound: this one must stop serving (rule S7)."""


@dataclass(frozen=True, slots=True)
class TimestampRange:
    """``count`` consecutive timestamps starting at ``first``."""

    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def _encode_bound(bound: int, owner: str) -> bytes:
    return f"{bound} {owner}".encode()


def _decode_bound(raw: bytes) -> int:
    try:
        return int(raw.split(b" ", 1)[0])
    except ValueError as exc:
        raise StoreError(f"corrupt oracle bound row {raw!r}") from exc


class TimestampOracle:
    """Hands out strictly increasing timestamps, singly or in ranges.

    Before serving a timestamp at or above its persisted bound, the oracle moves
    the bound up with compare-and-set against the exact value it last wrote. A
    restart therefore starts above everything an earlier incarnation could have
    served; a second oracle on the same store changes the row, so the first one's
    next extension fails and it raises :class:`OracleFencedError` from then on
    instead of serving timestamps the second may also serve.
    """

    def __init__(self, store: KVStore, *, window: int = DEFAULT_WINDOW) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        self._store = store
        self._window = window
        self._owner = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._fenced = False
        self._persisted: bytes | None = None
        self._next, self._bound = self._take_over()
        log.info(
            "timestamp oracle %s serving from %d on %s", self._owner[:8], self._next, store.url
        )

    def _take_over(self) -> tuple[int, int]:
        # Retried only while other oracles start at the same moment; each lost
        # compare-and-set means someone else moved the bound, so re-read it.
        for _ in range(100):
            current = self._store.get_system(TSO_TABLE, [BOUND_KEY]).get(BOUND_KEY)
            start = FIRST_TIMESTAMP if current is None else _decode_bound(current)
            new = _encode_bound(start + self._window, self._owner)
            if self._store.compare_and_set(TSO_TABLE, BOUND_KEY, current, new).applied:
                self._persisted = new
                return start, start + self._window
        raise OracleFencedError("could not take over the timestamp bound: too much contention")

    def _extend(self, needed: int) -> None:
        new_bound = max(self._bound, self._next + needed) + self._window
        new = _encode_bound(new_bound, self._owner)
        result = self._store.compare_and_set(TSO_TABLE, BOUND_KEY, self._persisted, new)
        if not result.applied:
            self._fenced = True
            log.error(
                "timestamp oracle %s fenced: bound row now %r", self._owner[:8], result.current
            )
            raise OracleFencedError(
                "another timestamp oracle took over this store; refusing to serve"
            )
        self._persisted = new
        self._bound = new_bound

    def next_range(self, count: int) -> TimestampRange:
        """Reserve ``count`` consecutive timestamps, all above any served before."""
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"count must be int, got {type(count).__name__}")
        if count < 1:
            raise ValueError(f"count must be positive, got {count}")
        with self._lock:
            if self._fenced:
                raise OracleFencedError("this timestamp oracle was fenced by another")
            if self._next + count > self._bound:
                self._extend(count)
            first = self._next
            self._next += count
            return TimestampRange(first, count)

    def next_timestamp(self) -> int:
        """One fresh timestamp."""
        return self.next_range(1).first

    @property
    def fenced(self) -> bool:
        return self._fenced
