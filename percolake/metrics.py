"""Prometheus metrics of percolake, in ``prometheus_client``'s default registry.

Like :mod:`percolake.errors`, this module sits below every building block (the layer
contract in ``pyproject.toml``): it imports nothing of percolake, so the oracle
(``tso``), the lock server (``lockserver``) and the transaction layer (``txn``) record
into it directly, and ``percolake serve --metrics-listen HOST:PORT`` exposes it
(:func:`serve_metrics`). Every metric is named ``percolake_*``; README.md ("Metrics")
says what each one counts.

Recording is cheap: the hot paths use children bound to their labels once (the
``*_BY_*`` dictionaries below), never a label lookup per call. The gauges of what is
open or held now are computed when scraped, from the live objects that registered
(:func:`track_open_transactions`, :func:`track_locks_held`), held weakly.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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
    "lock_timeout",  # waited --lock-wait-ms for a concurrent committer's locks
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

# --- leader election (recorded by the election code: record_leader_change) -----------

LEADER_CHANGES = Counter(
    "percolake_leader_changes_total", "Changes of leadership seen by this process"
)
IS_LEADER = Gauge(
    "percolake_is_leader", "1 while this process leads its role, else 0", labelnames=["role"]
)
LEADER_EPOCH = Gauge(
    "percolake_leader_epoch", "The leadership epoch this process last saw", labelnames=["role"]
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


def record_leader_change(role: str, epoch: int, is_leader: bool) -> None:
    """This process gained (``is_leader``) or lost the leadership of ``role`` (``"tso"``,
    ``"locks"``) in ``epoch``: for the election code to call on every change."""
    LEADER_CHANGES.inc()
    IS_LEADER.labels(role=role).set(1 if is_leader else 0)
    LEADER_EPOCH.labels(role=role).set(epoch)


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
OPEN_TRANSACTIONS.set_function(_open_transactions)
LOCKS_HELD.set_function(_locks_held)


def track_open_transactions(count: Callable[[], int]) -> None:
    """Add a gateway's count of open transactions (a bound method) to the gauge."""
    _open_transactions.add(count)


def track_locks_held(count: Callable[[], int]) -> None:
    """Add a lock table's count of granted lock batches (a bound method) to the gauge."""
    _locks_held.add(count)


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
