"""Prometheus metrics of percolake, in ``prometheus_client``'s default registry.

Like :mod:`wire.errors`, this module sits below every building block (the layer
contract in ``pyproject.toml``): it imports nothing of percolake, so the oracle
(``tso``), the lock server (``lockserver``) and the transaction layer (``txn``) record
into it directly, and ``percolake serve --metrics-listen HOST:PORT`` exposes it
(:func:`serve_metrics`). Every metric is named ``percolake_*``; docs/operations.md ("Metrics")
says what each one counts.

Recording is cheap: the hot paths use children bound to their labels once (the
``*_BY_*`` dictionaries below), never a label lookup per call. The gauges of what is
open or held now are computed when scraped, from the live objects that registered
(:func:`track_open_transactions`, :func:`track_locks_held`, :func:`track_lock_waiters`),
held weakly.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: Buckets of the latency histograms, in seconds: from 100 µs (a step on the memory
#: store) to 30 s (a lock wait or a commit point settling a slow store).
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

# --- transactions ---------------------------------------------------------------------

COMMITS = Counter(
    "percolake_commits_total",
    "Transactions committed (those that wrote: a read-only transaction commits nothing)",
)

#: Why transactions ended without committing. The commit's reasons come from the
#: exception the committer raised and the step that raised it; the others from who
#: called ``abort``.
ABORT_REASONS = (
    "conflict",  # write-write conflict: another writer of a cell committed first
    "lock_timeout",  # waited --lock-wait-ms for locks another transaction held
    "deadlock",  # chosen as a deadlock's victim by the lock server (DeadlockError)
    "lock_lost",  # a reader or writer found the commit stalled and aborted it
    "validation",  # SERIALIZABLE: what it read changed before commit_ts
    "snapshot_too_old",  # the snapshot fell below the garbage-collection safe point
    "store_error",  # the store failed a step before the commit point
    "user",  # the client aborted (abort(), or run()/with ending on an exception)
    "idle",  # the gateway aborted it after --idle-timeout-s without a call
    "fenced",  # the gateway aborted it to settle its outcome for another client
    "shutdown",  # the gateway aborted it while shutting down
    "other",  # the oracle or lock server failed, or anything else before the commit point
)
ABORTS = Counter("percolake_aborts_total", "Transactions aborted, by reason", labelnames=["reason"])
ABORTS_BY_REASON = {reason: ABORTS.labels(reason=reason) for reason in ABORT_REASONS}

COMMIT_UNKNOWN = Counter(
    "percolake_commit_unknown_total",
    "Commits whose outcome could not be settled (CommitUnknownError, rule S6)",
)
COMMIT_STEP_SECONDS = Histogram(
    "percolake_commit_step_seconds",
    "Latency of each step of the commit protocol, for commits that committed",
    labelnames=["step"],
    buckets=LATENCY_BUCKETS,
)
COMMIT_SECONDS = Histogram(
    "percolake_commit_seconds",
    "Latency of a whole commit (its steps together), for commits that committed",
    buckets=LATENCY_BUCKETS,
)
#: How a commit that did not commit ended: ``aborted`` (definitely not committed) or
#: ``unknown`` (CommitUnknownError: its outcome could not be settled).
FAILED_COMMIT_OUTCOMES = ("aborted", "unknown")
COMMIT_FAILED_SECONDS = Histogram(
    "percolake_commit_failed_seconds",
    "Latency of a whole commit that did not commit, until it failed, by outcome",
    labelnames=["outcome"],
    buckets=LATENCY_BUCKETS,
)
COMMIT_FAILED_SECONDS_BY_OUTCOME = {
    outcome: COMMIT_FAILED_SECONDS.labels(outcome=outcome) for outcome in FAILED_COMMIT_OUTCOMES
}
STORE_ERRORS = Counter(
    "percolake_store_errors_total",
    "Store errors seen by the transaction layer, by operation (a commit step, read, scan)",
    labelnames=["op"],
)
OPEN_TRANSACTIONS = Gauge(
    "percolake_open_transactions", "Transactions open in this process's gateway"
)

# --- the oracle and the lock server ---------------------------------------------------

TIMESTAMPS_SERVED = Counter(
    "percolake_timestamps_served_total", "Timestamps handed out by the timestamp oracle"
)
LOCK_WAITS = Counter(
    "percolake_lock_waits_total",
    "Lock acquisitions that had to wait for another holder (granted or timed out)",
)
LOCK_WAIT_SECONDS = Histogram(
    "percolake_lock_wait_seconds",
    "How long lock acquisitions that had to wait waited",
    buckets=LATENCY_BUCKETS,
)
LOCKS_HELD = Gauge("percolake_locks_held", "Lock batches granted by this process's lock server")
LOCK_WAITERS = Gauge(
    "percolake_lock_waiters", "Lock calls waiting in this process's lock server's queues now"
)
LOCK_WAIT_TIMEOUTS = Counter(
    "percolake_lock_wait_timeouts_total",
    "Lock acquisitions that waited until their wait timeout and got nothing",
)
LOCK_DEADLOCKS = Counter(
    "percolake_lock_deadlocks_total",
    "Lock calls refused as the victim of a deadlock (DeadlockError): one per cycle found",
)
PESSIMISTIC_LOCKS = Counter(
    "percolake_pessimistic_locks_total",
    "Cells locked at read time by get_for_update (granted; a cell locked twice counts once)",
)

# --- leader election ------------------------------------------------------------------
#
# percolake_is_leader, percolake_leader_epoch and percolake_leader_row_age_seconds are
# computed when scraped from the leases that registered (track_lease), so that they are
# true at every scrape, on every replica: a lease that ran out (the store is down, the
# process was paused) reads 0 though no step-down happened yet.

LEADER_CHANGES = Counter(
    "percolake_leader_changes_total",
    "Changes of the leader (a new epoch in the leader row) seen by this process",
)

# --- garbage collection (recorded by the collector's passes) ---------------------------

#: Buckets of the pass duration, in seconds: a pass over an empty store takes
#: milliseconds, one over a large table minutes.
GC_PASS_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
GC_PASSES = Counter(
    "percolake_gc_passes_total",
    "Garbage-collection passes run by this process, by outcome (done, or failed: the "
    "next pass resumes it)",
    labelnames=["outcome"],
)
GC_PASSES_DONE = GC_PASSES.labels(outcome="done")
GC_PASSES_FAILED = GC_PASSES.labels(outcome="failed")
GC_VERSIONS_DELETED = Counter(
    "percolake_gc_versions_deleted_total", "Versions garbage collection deleted"
)
GC_ENTRIES_DELETED = Counter(
    "percolake_gc_entries_deleted_total",
    "Transactions-table entries garbage collection deleted",
)
GC_PASS_SECONDS = Histogram(
    "percolake_gc_pass_seconds",
    "Duration of the garbage-collection passes that finished",
    buckets=GC_PASS_BUCKETS,
)
GC_SAFE_POINT = Gauge(
    "percolake_gc_safe_point", "The safe point the last pass of this process published"
)

# --- the lakehouse gateway ------------------------------------------------------------

LAKEHOUSE_GROUP_COMMITS = Histogram(
    "percolake_lakehouse_group_commits",
    "Lakehouse commits per group transaction of this gateway, for groups that committed",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
)


def record_abort(reason: str) -> None:
    """Count one transaction aborted for ``reason`` (one of :data:`ABORT_REASONS`)."""
    ABORTS_BY_REASON[reason].inc()


def record_store_error(op: str) -> None:
    """Count one store error the transaction layer saw in operation ``op``."""
    STORE_ERRORS.labels(op=op).inc()


def record_lock_wait(since: float | None) -> None:
    """Count a lock acquisition that waited from ``since`` (``time.monotonic()``) until
    now; ``None``: it did not wait, nothing to count."""
    if since is not None:
        LOCK_WAITS.inc()
        LOCK_WAIT_SECONDS.observe(time.monotonic() - since)


def record_lock_wait_timeout() -> None:
    """A lock acquisition waited until its timeout and got nothing."""
    LOCK_WAIT_TIMEOUTS.inc()


def record_lock_deadlock() -> None:
    """A lock call was chosen as the victim of a deadlock."""
    LOCK_DEADLOCKS.inc()


def record_leader_seen() -> None:
    """This process saw a new epoch in a leader row: for the election code to call."""
    LEADER_CHANGES.inc()


def record_gc_safe_point(safe_point: int, since_wall_s: float | None) -> None:
    """A pass published ``safe_point``, a timestamp handed out at wall time
    ``since_wall_s`` (``time.time()``; ``None``: not known)."""
    GC_SAFE_POINT.set(safe_point)
    _gc_safe_point_wall.set(since_wall_s)


def record_gc_pass(seconds: float, versions_deleted: int, entries_deleted: int) -> None:
    """A garbage-collection pass finished after ``seconds``."""
    GC_PASSES_DONE.inc()
    GC_PASS_SECONDS.observe(seconds)
    GC_VERSIONS_DELETED.inc(versions_deleted)
    GC_ENTRIES_DELETED.inc(entries_deleted)


def record_gc_pass_failed() -> None:
    """A garbage-collection pass failed (the next one resumes it)."""
    GC_PASSES_FAILED.inc()


class _Lease(Protocol):
    """What the leadership metrics read of a leader lease (``tso.LeaderLease``)."""

    @property
    def role(self) -> str: ...

    @property
    def stopped(self) -> bool: ...

    def valid(self) -> bool: ...

    def seen_epoch(self) -> int | None: ...

    def row_age_s(self) -> float | None: ...


class _Leadership(Collector):
    """``percolake_is_leader``, ``percolake_leader_epoch`` and
    ``percolake_leader_row_age_seconds`` by role, read from the live leases at scrape
    time. Leases are held weakly; released ones no longer count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: list[weakref.ref[_Lease]] = []

    def add(self, lease: _Lease) -> None:
        with self._lock:
            self._leases = [ref for ref in self._leases if ref() is not None]
            self._leases.append(weakref.ref(lease))

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "percolake_is_leader",
                "1 while this process holds a valid leader lease of the role, else 0",
                labels=["role"],
            ),
            GaugeMetricFamily(
                "percolake_leader_epoch",
                "The epoch of the leader row this process last read (0: none yet)",
                labels=["role"],
            ),
            GaugeMetricFamily(
                "percolake_leader_row_age_seconds",
                "Seconds since this process saw the leader row change (a leader renews "
                "it every quarter lease)",
                labels=["role"],
            ),
        )

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            leases = [lease for ref in self._leases if (lease := ref()) is not None]
        leading: dict[str, bool] = {}
        epochs: dict[str, int] = {}
        ages: dict[str, float] = {}
        for lease in leases:
            if lease.stopped:
                continue
            role = lease.role
            leading[role] = leading.get(role, False) or lease.valid()
            epochs[role] = max(epochs.get(role, 0), lease.seen_epoch() or 0)
            age = lease.row_age_s()
            if age is not None:
                ages[role] = min(ages.get(role, age), age)
        is_leader, epoch, row_age = self._families()
        for role in sorted(leading):
            is_leader.add_metric([role], 1.0 if leading[role] else 0.0)
            epoch.add_metric([role], float(epochs[role]))
            if role in ages:
                row_age.add_metric([role], ages[role])
        return iter((is_leader, epoch, row_age))


class _SafePointAge(Collector):
    """``percolake_gc_safe_point_age_seconds``: how far behind now the published safe
    point lies, at scrape time (absent until a pass of this process published one)."""

    def __init__(self) -> None:
        self._wall_s: float | None = None

    def set(self, wall_s: float | None) -> None:
        self._wall_s = wall_s

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "percolake_gc_safe_point_age_seconds",
            "Seconds since the timestamp of the last published safe point was handed out "
            "(about the retention, plus the pass interval)",
        )

    def describe(self) -> Iterator[Metric]:
        return iter((self._family(),))

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        wall_s = self._wall_s
        if wall_s is not None:
            family.add_metric([], max(0.0, time.time() - wall_s))
        return iter((family,))


_leadership = _Leadership()
_gc_safe_point_wall = _SafePointAge()
REGISTRY.register(_leadership)
REGISTRY.register(_gc_safe_point_wall)


def track_lease(lease: _Lease) -> None:
    """Export ``lease``'s leadership (held weakly) in the leadership gauges."""
    _leadership.add(lease)


class _SumOfLive:
    """The sum of counts from live objects: a gauge's function, evaluated when scraped.

    Holds bound methods weakly, so a gateway or lock table that is gone stops counting
    without unregistering (tests build thousands of them).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: list[weakref.WeakMethod[Callable[[], int]]] = []

    def add(self, count: Callable[[], int]) -> None:
        """``count`` must be a bound method; it is held as long as its object lives."""
        with self._lock:
            self._sources = [ref for ref in self._sources if ref() is not None]
            self._sources.append(weakref.WeakMethod(count))

    def __call__(self) -> float:
        with self._lock:
            live = [count for ref in self._sources if (count := ref()) is not None]
        return float(sum(count() for count in live))


_open_transactions = _SumOfLive()
_locks_held = _SumOfLive()
_lock_waiters = _SumOfLive()
OPEN_TRANSACTIONS.set_function(_open_transactions)
LOCKS_HELD.set_function(_locks_held)
LOCK_WAITERS.set_function(_lock_waiters)


def track_open_transactions(count: Callable[[], int]) -> None:
    """Add a gateway's count of open transactions (a bound method) to the gauge."""
    _open_transactions.add(count)


def track_locks_held(count: Callable[[], int]) -> None:
    """Add a lock table's count of granted lock batches (a bound method) to the gauge."""
    _locks_held.add(count)


def track_lock_waiters(count: Callable[[], int]) -> None:
    """Add a lock table's count of waiting lock calls (a bound method) to the gauge."""
    _lock_waiters.add(count)


class MetricsServer:
    """The default registry over plain HTTP (``GET /metrics``) until :meth:`close`."""

    def __init__(self, host: str, port: int) -> None:
        """Listens on ``host:port`` (port 0: a free one, then in :attr:`port`);
        ``OSError`` when it cannot."""
        self._server: WSGIServer
        self._server, self._thread = start_http_server(port, host)
        self.port: int = self._server.server_port
        self._closed = False

    def close(self) -> None:
        """Stop serving and free the port. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
