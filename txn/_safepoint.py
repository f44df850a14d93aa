"""The garbage-collection safe point as transactions see it (rule S8).

Garbage collection sweeps versions below a *safe point* ``sp``: it keeps, of each cell,
the newest version committed below ``sp`` (and everything newer), so a snapshot at or
above ``sp`` reads what it read before, and a snapshot below ``sp`` may not. Two rows of
the system table ``_gc`` carry what the two sides must know of each other:

* ``state``: the safe point and how long collection waits after raising it before it
  deletes anything (``grace_ms``), plus the samples that map wall time to timestamps
  for the retention, and the last pass's report (written by :mod:`txn._gc`);
* ``clients``: each manager's registration: the oldest start timestamp among its live
  transactions, a timestamp it was served and the wall time it published them, with a
  lease (:class:`Registration`). Collection keeps the safe point at or below every live
  registration's oldest transaction, so live transactions, however old, keep their
  snapshot. That is liveness only: a registration that is late, lost or expired by a
  skewed clock costs a transaction a :class:`SnapshotTooOldError`, never a wrong read.

Safety rests on :class:`SafePointGuard` alone, a lease on the state row read by each
manager: after a read returns, the reader checks that it read the row less than
``grace_ms / 2`` ago by its own monotonic clock (else it reads the row again) and that
its snapshot is not below the safe point the row showed. Collection raises the safe
point with a compare-and-set and deletes nothing below the new one until ``grace_ms``
later by *its* monotonic clock. So a read that passed the check either ended before any
deletion below a safe point above its snapshot began, or was checked against that safe
point. The assumption: the two clocks' rates differ by far less than a factor of two
(bounded drift; no synchronised clocks).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from storage_adapters import KVStore, StoreError
from txn.errors import SnapshotTooOldError

log = logging.getLogger(__name__)

#: System table of garbage collection: the ``state`` and ``clients`` rows.
GC_TABLE = "_gc"
STATE_KEY = b"state"
CLIENTS_KEY = b"clients"

#: How long collection waits after raising the safe point before deleting below it;
#: readers refresh their lease on the state row every half of it.
DEFAULT_GRACE_MS = 5_000


@dataclass(frozen=True, slots=True)
class GcState:
    """The ``state`` row: the safe point, the grace, time samples and the last pass."""

    safe_point: int = 0
    grace_ms: int = DEFAULT_GRACE_MS
    #: Committed transactions below this had their entries collected (S9).
    collected_below: int = 0
    #: ``(wall_ms, ts)``: ``ts`` was served before ``wall_ms``, so any transaction
    #: that began after ``wall_ms`` started above ``ts``. Oldest first.
    samples: tuple[tuple[int, int], ...] = ()
    last_pass: dict[str, Any] = field(default_factory=dict)
    #: A longer grace this row held before a collector lowered it to ``grace_ms`` (0:
    #: none). Readers may still hold leases read under it, so every collector waits it
    #: too, until a pass that began after the lowering ``lowering`` (its id) and ran
    #: for at least this long clears it (``txn._gc``, "Lowering the grace").
    lowered_from_ms: int = 0
    lowering: str = ""

    def encode(self) -> bytes:
        fields: dict[str, Any] = {
            "safe_point": self.safe_point,
            "grace_ms": self.grace_ms,
            "collected_below": self.collected_below,
            "samples": [list(s) for s in self.samples],
            "last_pass": self.last_pass,
        }
        if self.lowered_from_ms:
            fields.update(lowered_from_ms=self.lowered_from_ms, lowering=self.lowering)
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> GcState:
        if raw is None:
            return cls()
        try:
            got = json.loads(raw)
            return cls(
                safe_point=int(got["safe_point"]),
                grace_ms=int(got["grace_ms"]),
                collected_below=int(got.get("collected_below", 0)),
                samples=tuple((int(w), int(t)) for w, t in got.get("samples", ())),
                last_pass=dict(got.get("last_pass", {})),
                lowered_from_ms=int(got.get("lowered_from_ms", 0)),
                lowering=str(got.get("lowering", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"corrupt garbage-collection state row {raw[:200]!r}") from exc


def read_state(store: KVStore) -> tuple[GcState, bytes | None]:
    """The state row, decoded, and its raw value (for a compare-and-set)."""
    raw = store.get_system(GC_TABLE, [STATE_KEY]).get(STATE_KEY)
    return GcState.decode(raw), raw


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """One manager's registration in the ``clients`` row."""

    oldest: int | None  # oldest start_ts of its live transactions; None: none open
    latest_ts: int  # a timestamp it was served before wall_ms (0: none yet)
    wall_ms: int
    lease_ms: int

    def live(self, now_ms: int) -> bool:
        return now_ms <= self.wall_ms + self.lease_ms


def decode_clients(raw: bytes | None) -> dict[str, ClientInfo]:
    if raw is None:
        return {}
    try:
        return {k: ClientInfo(*v) for k, v in json.loads(raw).items()}
    except (ValueError, TypeError) as exc:
        raise StoreError(f"corrupt garbage-collection clients row {raw[:200]!r}") from exc


def encode_clients(clients: dict[str, ClientInfo]) -> bytes:
    return json.dumps(
        {k: [c.oldest, c.latest_ts, c.wall_ms, c.lease_ms] for k, c in sorted(clients.items())}
    ).encode()


class SafePointGuard:
    """A manager's lease on the safe point: :meth:`check` after every read (rule S8)."""

    def __init__(self, store: KVStore, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._safe_point = 0
        self._valid_until = float("-inf")  # by the monotonic clock
        self.refreshes = 0

    def safe_point(self) -> int:
        """The safe point, read again when the lease on it ran out."""
        with self._lock:
            if self._monotonic() < self._valid_until:
                return self._safe_point
        sent = self._monotonic()
        state, _ = read_state(self._store)
        with self._lock:
            self.refreshes += 1
            self._safe_point = max(state.safe_point, self._safe_point)
            self._valid_until = sent + state.grace_ms / 2000
            return self._safe_point

    def check(self, start_ts: int) -> None:
        """Raise :class:`SnapshotTooOldError` unless reads at ``start_ts`` that ended
        before this call read only what garbage collection kept."""
        safe_point = self.safe_point()
        if start_ts < safe_point:
            raise SnapshotTooOldError(
                f"transaction {start_ts} is older than the garbage-collection safe point "
                f"{safe_point}: versions it could read may be swept; start a new one "
                "(raise the collection's retention for longer transactions)"
            )


class Registration:
    """Publishes a manager's long-running transactions in the ``clients`` row.

    A daemon thread, started with the manager's first transaction, publishes every
    ``interval_s`` (with a lease of three intervals) the oldest start_ts among the
    transactions that were already open at the previous publication, and the newest
    timestamp the manager was served (a sample for the retention). A transaction younger
    than one interval is not published: the retention (minutes, against an interval of
    seconds) covers it. :meth:`close` removes the entry.
    """

    def __init__(
        self,
        store: KVStore,
        oldest: Callable[[], tuple[int | None, int]],
        *,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._oldest = oldest
        self._interval_s = interval_s
        self._clock = clock
        self.id = uuid.uuid4().hex[:16]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._previous_latest = 0
        self.publications = 0
        #: One publication at a time: a tick reads what is open, then writes it, and one
        #: that read earlier must not write over a later one's entry (the loop's first
        #: tick and a test's or close()'s publication could interleave that way).
        self._publishing = threading.Lock()

    def start(self) -> None:
        with self._start_lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(
                target=_publish_loop,
                args=(weakref.ref(self), self._stop, self._interval_s),
                name="percolake-gc-registration",
                daemon=True,
            )
            self._thread.start()

    def publish(self, oldest: int | None, latest: int) -> None:
        """Write this manager's entry now (and prune expired ones)."""
        now_ms = int(self._clock() * 1000)
        lease_ms = int(self._interval_s * 3000)
        self._update(
            lambda clients: clients.__setitem__(
                self.id, ClientInfo(oldest, latest, now_ms, lease_ms)
            )
        )
        self.publications += 1

    def _update(self, change: Callable[[dict[str, ClientInfo]], object]) -> None:
        for _ in range(20):
            raw = self._store.get_system(GC_TABLE, [CLIENTS_KEY]).get(CLIENTS_KEY)
            clients = decode_clients(raw)
            now_ms = int(self._clock() * 1000)
            clients = {k: c for k, c in clients.items() if c.live(now_ms - 60_000) or k == self.id}
            change(clients)
            if self._store.compare_and_set(
                GC_TABLE, CLIENTS_KEY, raw, encode_clients(clients)
            ).applied:
                return
        raise StoreError("could not update the garbage-collection clients row: contention")

    def tick(self) -> None:
        with self._publishing:
            oldest, latest = self._oldest()
            if oldest is not None and oldest > self._previous_latest:
                oldest = None  # began since the last publication: the retention covers it
            self._previous_latest = latest
            if latest:
                self.publish(oldest, latest)

    def close(self) -> None:
        """Publish that nothing is open any more. The entry stays until its lease runs
        out (others prune it): its timestamp sample still serves the retention."""
        self._stop.set()
        with self._publishing:
            _, latest = self._oldest()
            if latest:
                try:
                    self.publish(None, latest)
                except (StoreError, ValueError) as exc:
                    log.debug("could not update garbage-collection registration: %s", exc)


def _publish_loop(ref: weakref.ref[Registration], stop: threading.Event, interval_s: float) -> None:
    while True:
        registration = ref()
        if registration is None:
            return
        try:
            registration.tick()
        except (StoreError, ValueError) as exc:
            log.debug("garbage-collection registration failed: %s", exc)
        del registration
        if stop.wait(interval_s):
            return
