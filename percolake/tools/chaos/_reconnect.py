"""A store that, after its process was paused, takes a while to answer again.

A server paused for seconds (a stop-the-world collection, a frozen VM, SIGSTOP) that
talks to its store across a network finds its connections dead when it wakes up: its
first store calls wait until the client has reconnected. On SQLite, a local file, the
same server reads the store microseconds after it wakes. That matters for the leader
lease (rule S7): a leader woken from a pause learns that it lost the lead only from its
next read of the leader row, and a leader that serves without checking its lease by
its own clock (the test-only build of :mod:`percolake.tools.chaos.unsafe`) serves stale
timestamps only until that read. To give chaos runs on SQLite the window a networked
store gives, the chaos build (``python -m percolake.tools.chaos.serve``) wraps its store in
:class:`ReconnectingStore` when ``PERCOLAKE_CHAOS_STORE_RECONNECT_MS`` is set: after
the process was paused, every store call waits until that many milliseconds after the
wake-up. Nothing else changes; a correct leader, which checks its lease, is unaffected.

A pause is noticed either way round: a ticker thread notes the time every
:data:`TICK_S`, and a call that finds the last tick older than :data:`PAUSE_GAP_S` (or a
tick that finds the previous one that old) marks the store down until the reconnect.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from storage_adapters import (
    CasResult,
    Cell,
    Claim,
    KVStore,
    ScanEntry,
    VersionStamp,
    VersionWrite,
    open_store,
)

log = logging.getLogger(__name__)

#: Test builds only: after a pause, store calls wait this many ms (a reconnect).
STORE_RECONNECT_ENV: Final = "PERCOLAKE_CHAOS_STORE_RECONNECT_MS"
TICK_S: Final = 0.02
#: A gap between ticks this long is a pause (a loaded machine delays ticks too, but not
#: by half a second).
PAUSE_GAP_S: Final = 0.5


def reconnect_ms_from_env(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    raw = env.get(STORE_RECONNECT_ENV, "")
    if not raw:
        return 0
    value = int(raw)
    if not 0 <= value <= 60_000:
        raise ValueError(f"{STORE_RECONNECT_ENV} must be 0-60000 ms, got {value}")
    return value


def store_opener(reconnect_ms: int) -> Callable[[str], KVStore]:
    """``open_store``, wrapped in :class:`ReconnectingStore` when ``reconnect_ms`` > 0."""
    if reconnect_ms <= 0:
        return open_store

    def open_reconnecting(url: str) -> KVStore:
        return ReconnectingStore(open_store(url), reconnect_ms / 1000)

    return open_reconnecting


class ReconnectingStore(KVStore):
    """``inner``, with every call after a pause of this process delayed until
    ``reconnect_s`` after the wake-up."""

    def __init__(self, inner: KVStore, reconnect_s: float) -> None:
        self._inner = inner
        self._reconnect_s = reconnect_s
        self._lock = threading.Lock()
        self._tick = time.monotonic()
        self._down_until = float("-inf")
        self.pauses = 0
        self._closed = threading.Event()
        threading.Thread(target=self._ticker, name="store-reconnect-ticker", daemon=True).start()
        log.warning(
            "%s: after a pause of this process its store answers only %.0f ms after the "
            "wake-up (a store across a network reconnecting)",
            STORE_RECONNECT_ENV,
            reconnect_s * 1000,
        )

    def _noticed(self, now: float) -> None:
        with self._lock:
            if now - self._tick >= PAUSE_GAP_S and now >= self._down_until:
                self._down_until = now + self._reconnect_s
                self.pauses += 1
                log.warning(
                    "paused for %.1f s: the store answers again in %.0f ms",
                    now - self._tick,
                    self._reconnect_s * 1000,
                )
            self._tick = max(self._tick, now)

    def _ticker(self) -> None:
        while not self._closed.wait(TICK_S):
            self._noticed(time.monotonic())

    def _wait(self) -> None:
        now = time.monotonic()
        if now - self._tick >= PAUSE_GAP_S:
            self._noticed(now)
        left = self._down_until - time.monotonic()
        if left > 0:
            time.sleep(left)

    # --- KVStore, delegated ------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._inner.url

    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        self._wait()
        self._inner.put_versions(table, versions)

    def get_latest(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.get_latest(*args, **kwargs)

    def get_latest_of_tables(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.get_latest_of_tables(*args, **kwargs)

    def put_versions_of_tables(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.put_versions_of_tables(*args, **kwargs)

    def get_version_timestamps_of_tables(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.get_version_timestamps_of_tables(*args, **kwargs)

    def put_versions_read_back_of_tables(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.put_versions_read_back_of_tables(*args, **kwargs)

    def _scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        self._wait()
        return self._inner.scan(
            table, start_row, end_row, below_ts, start_column=start_column, page_size=page_size
        )

    def get_version_timestamps(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.get_version_timestamps(*args, **kwargs)

    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        self._wait()
        self._inner.delete_versions(table, versions)

    def get_versions(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.get_versions(*args, **kwargs)

    def delete_version_ranges(
        self, table: str, ranges: Sequence[tuple[bytes, bytes, int, int]]
    ) -> int:
        self._wait()
        return self._inner.delete_version_ranges(table, ranges)

    def prune_cells(self, table: str, below_ts: int) -> int:
        self._wait()
        return self._inner.prune_cells(table, below_ts)

    def prune_emptied_cells(self, table: str, below_ts: int, cells: Sequence[Cell]) -> int:
        self._wait()
        return self._inner.prune_emptied_cells(table, below_ts, cells)

    def sweep_candidates(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return self._inner.sweep_candidates(*args, **kwargs)

    def stamp_versions(self, table: str, stamps: Sequence[VersionStamp]) -> None:
        self._wait()
        self._inner.stamp_versions(table, stamps)

    def tables(self) -> list[str]:
        self._wait()
        return self._inner.tables()

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        self._wait()
        return self._inner.put_unless_exists(table, key, value)

    def compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> CasResult:
        self._wait()
        return self._inner.compare_and_set(table, key, expected, value)

    def get_system(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        self._wait()
        return self._inner.get_system(table, keys)

    def delete_system(self, table: str, key: bytes, expected: bytes) -> CasResult:
        self._wait()
        return self._inner.delete_system(table, key, expected)

    def get_system_final(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        self._wait()
        return self._inner.get_system_final(table, keys)

    def delete_system_many(self, table: str, rows: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        self._wait()
        return self._inner.delete_system_many(table, rows)

    def claim(self, role: str) -> Claim:
        return self._inner.claim(role)

    def close(self) -> None:
        self._closed.set()
        self._inner.close()
