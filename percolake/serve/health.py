"""``grpc.health.v1.Health`` of ``percolake serve``: each service is SERVING exactly
while this process can serve it (docs/design/replicas.md, "Health follows the ability
to serve"), not merely while the process runs."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2

from wire.channels import Connection
from wire.v1 import lock_pb2, timestamp_pb2, transaction_pb2

# The name operators filter on (docs/operations.md) since serve was one module.
log = logging.getLogger("percolake.server")

#: The gRPC service each role serves.
ROLE_SERVICES = {
    "tso": timestamp_pb2.DESCRIPTOR.services_by_name["TimestampService"].full_name,
    "locks": lock_pb2.DESCRIPTOR.services_by_name["LockService"].full_name,
    "txn": transaction_pb2.DESCRIPTOR.services_by_name["TransactionService"].full_name,
}

#: How often :class:`HealthMonitor` checks: a fraction of the default lease, so that
#: health follows a lease that runs out or a store that stops answering within a round.
HEALTH_INTERVAL_S = 0.25
#: How long a split gateway's health check waits for its oracle's or lock server's.
_UPSTREAM_CHECK_TIMEOUT_S = 1.0


class HealthMonitor:
    """Keeps ``grpc.health.v1.Health`` true: each service with a problem function is
    SERVING exactly while it returns ``None``, checked every :data:`HEALTH_INTERVAL_S`.

    Services in ``always_serving`` without one (the control service, health itself)
    answer SERVING while the process runs. The server as a whole (``""``) is SERVING
    while every checked service is, draining aside: a drain turns each checked service
    NOT_SERVING (load balancers and probes of a service move away) but leaves ``""``,
    which percolake's own clients of several replicas probe, so that transactions open
    on a draining replica keep their calls on it until they commit.
    """

    def __init__(
        self,
        servicer: health.HealthServicer,
        problems: dict[str, Callable[[], str | None]],
        *,
        always_serving: list[str],
        interval_s: float | None = None,
    ) -> None:
        self._servicer = servicer
        self._problems = problems
        self._interval_s = HEALTH_INTERVAL_S if interval_s is None else interval_s
        self._draining = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._state: dict[str, str | None] = {}  # the problem each service was last set for
        for name in always_serving:
            if name not in problems:
                servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.check()
        self._thread = threading.Thread(target=self._run, name="percolake-health", daemon=True)
        self._thread.start()

    def drain(self) -> None:
        """The server drains (admits no new transaction): every checked service answers
        NOT_SERVING from now on. The hook of :meth:`RunningServer.stop`."""
        self._draining.set()
        self.check()

    def check(self) -> None:
        """Set every service's status from its problem function now."""
        with self._lock:
            overall: str | None = None
            for name, problem_of in self._problems.items():
                try:
                    problem = problem_of()
                except Exception as exc:  # a probe that fails is a problem, not a crash
                    problem = f"health check failed: {exc}"
                if problem is not None and overall is None:
                    overall = problem
                if self._draining.is_set():
                    problem = "draining: this replica admits no new transaction"
                self._set(name, problem)
            self._set("", overall)

    def _set(self, name: str, problem: str | None) -> None:
        if name in self._state and self._state[name] == problem:
            return
        was = self._state.get(name, "starting")
        self._state[name] = problem
        shown = name or "the server"
        if problem is None:
            self._servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
            if was != "starting":
                log.info("health: %s SERVING again", shown)
        else:
            self._servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            # A changed cause (the outage's seconds aside) is worth a line; the same
            # cause checked again is not.
            if was is None or was == "starting" or _cause_kind(was) != _cause_kind(problem):
                log.warning("health: %s NOT_SERVING: %s", shown, problem)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check()

    def close(self) -> None:
        """Stop checking (the statuses stay as they are). Idempotent."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


def upstream_problem(conn: Connection, role: str) -> str | None:
    """Why the oracle or lock server a split gateway calls cannot serve (None: it can),
    by its own health check."""
    check = conn.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    try:
        got = check(
            health_pb2.HealthCheckRequest(service=ROLE_SERVICES[role]),
            timeout=_UPSTREAM_CHECK_TIMEOUT_S,
        )
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        return f"{role} at {conn.address} unreachable ({code.name if code else exc})"
    except ValueError:  # its channel was closed: the server is stopping
        return f"{role} at {conn.address}: channel closed"
    if got.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{role} at {conn.address} cannot serve (its health says NOT_SERVING)"
    return None


def _cause_kind(problem: str) -> str:
    """A problem without its durations (they grow at every check), to log a cause once."""
    return re.sub(r"\d+(\.\d+)? s\b", "N s", problem)
