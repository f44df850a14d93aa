"""Who leads the replicated control plane of a run, read from the store's leader row.

Replicas of ``percolake serve`` elect their leader on one row of the store (the
``tso`` row of ``_leader``, see :mod:`tso._lease`). The harness reads the same row:
the leader faults find the replica to hit by the address in it, and a watcher records
every value the row takes during the run (each new epoch is a new term), so that the
report shows how often leadership changed hands and to whom.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from storage_adapters import KVStore, StoreError, open_store
from tso import LEADER_TABLE, LeaseRecord

log = logging.getLogger(__name__)

#: The leader row of the timestamp oracle (the replicas of ``serve all`` elect on it).
LEADER_KEY: Final = b"tso"
#: How often the watcher reads the row: a Cassandra read is a Paxos round.
WATCH_INTERVAL_S: Final = {"sqlite": 0.1, "cassandra": 0.5}
#: What a replica logs when it deposes a leader it cannot reach (``tso._lease``). On
#: SQLite the deposed row is taken over within tens of milliseconds, often between two
#: reads of the watcher (the landing-CI run of 2026-11-27: deposed at 59.582, epoch 2
#: held at 59.642), so the report counts depositions from the replicas' logs as well.
DEPOSED_LOG: Final = re.compile(r" deposed tso leader \S+ \(epoch (\d+)\)")


@dataclass(frozen=True, slots=True)
class LeaderSeen:
    """One value of the leader row, from when the watcher first read it."""

    at_s: float
    epoch: int
    address: str
    state: str  # held, released, deposed

    def to_json(self, names: dict[str, str]) -> dict[str, Any]:
        return {
            "at_s": round(self.at_s, 3),
            "epoch": self.epoch,
            "replica": names.get(self.address, self.address),
            "state": self.state,
        }


def _state(record: LeaseRecord) -> str:
    if record.released:
        return "released"
    return "deposed" if record.deposed_by else "held"


class LeaderWatch:
    """Reads the leader row of ``store_url``; :meth:`start` records its changes."""

    def __init__(self, store_url: str) -> None:
        self._url = store_url
        self._store: KVStore | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0_ns = 0
        self.seen: list[LeaderSeen] = []
        self.read_errors = 0
        kind = "cassandra" if store_url.startswith("cassandra") else "sqlite"
        self.interval_s = WATCH_INTERVAL_S[kind]

    def read(self) -> LeaseRecord | None:
        """The row now (a linearizable read); ``None`` when no replica ever led."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self._url)
            raw = self._store.get_system(LEADER_TABLE, [LEADER_KEY]).get(LEADER_KEY)
        return None if raw is None else LeaseRecord.decode(raw)

    def live_leader(self) -> LeaseRecord | None:
        """The row when it names a leader that may be serving (held, not released or
        deposed), else ``None``."""
        record = self.read()
        return record if record is not None and record.live else None

    def start(self, t0_ns: int) -> None:
        self._t0_ns = t0_ns
        self._thread = threading.Thread(target=self._watch, name="leader-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        """Read the row once and note it when it changed."""
        try:
            record = self.read()
        except StoreError as exc:
            self.read_errors += 1
            log.debug("leader row read failed: %s", exc)
            return
        if record is None:
            return
        at_s = (time.monotonic_ns() - self._t0_ns) / 1e9
        seen = LeaderSeen(at_s, record.epoch, record.address, _state(record))
        last = self.seen[-1] if self.seen else None
        if last is None or (last.epoch, last.address, last.state) != (
            seen.epoch,
            seen.address,
            seen.state,
        ):
            self.seen.append(seen)
            log.info("leader row: epoch %d %s by %s", seen.epoch, seen.state, seen.address or "-")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    def summary(self, names: dict[str, str], logs: Iterable[str] = ()) -> dict[str, Any]:
        """For the report: the epochs seen, how often a new leader took over, the row's
        history (replica names instead of addresses). ``logs``: the replicas' log texts,
        for the depositions the watcher read too late to see (:data:`DEPOSED_LOG`)."""
        deposed_in_row = {s.epoch for s in self.seen if s.state == "deposed"}
        deposed_logged = {int(m.group(1)) for text in logs for m in DEPOSED_LOG.finditer(text)}
        epochs = sorted({s.epoch for s in self.seen})
        held = [s for s in self.seen if s.state == "held"]
        leaders = [names.get(s.address, s.address) for s in held]
        return {
            "first_epoch": epochs[0] if epochs else None,
            "last_epoch": epochs[-1] if epochs else None,
            "epochs_seen": len(epochs),
            # A change: a later epoch held by someone (a term that started during the run).
            "leader_changes": max(0, len({s.epoch for s in held}) - 1),
            "leaders": sorted(set(leaders)),
            # Terms that ended deposed: seen in the row, or logged by the deposing replica.
            "deposed": len(deposed_in_row | deposed_logged),
            "deposed_in_row": len(deposed_in_row),
            "released": sum(1 for s in self.seen if s.state == "released"),
            "read_errors": self.read_errors,
            "row": [s.to_json(names) for s in self.seen],
        }
