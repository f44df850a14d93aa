"""``percolake serve``: the oracle, the lock server and the gateway as gRPC servers."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from lockserver import LockTable
from lockserver.lock_service import LockServicer, RemoteLockService
from percolake.replica import DEFAULT_FAILOVER_S, ControlPlane
from percolake.status import SERVICE_NAME as CONTROL_SERVICE
from percolake.status import ControlServicer
from spark_integration.service import SERVICE_NAME as LAKEHOUSE_SERVICE
from spark_integration.service import LakehouseLimits, LakehouseServicer, serve_lakehouse
from storage_adapters import KVStore, StoreError, open_store
from tso import OracleAlreadyRunningError, TimestampBatcher, TimestampOracle
from tso._lease import DEFAULT_LEASE_MS, LEADER_TABLE, check_lease_ms
from tso.timestamp_service import RemoteTimestampSource, TimestampServicer
from txn import COMMIT_STEPS, GarbageCollector, GcLoop, TransactionConfig, TransactionManager
from txn._services import LockService, TimestampSource
from txn.gateway import GatewayLimits, TransactionServicer
from wire.errors import PercolakeError
from wire.metrics import MetricsServer
from wire.rpc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Connection,
    TlsConfig,
    TokenInterceptor,
    parse_address,
    parse_addresses,
    resolve_token,
)
from wire.v1 import (
    control_pb2_grpc,
    lock_pb2,
    lock_pb2_grpc,
    timestamp_pb2,
    timestamp_pb2_grpc,
    transaction_pb2,
    transaction_pb2_grpc,
)

log = logging.getLogger("percolake.server")

ROLES = ("all", "tso", "locks", "txn")
DEFAULT_STORE = "sqlite:///.percolake/store.db"
DEFAULT_LISTEN = "127.0.0.1:7070"

#: How long a split-role gateway waits for the oracle and the lock server: longer than
#: their replicas wait for a leader, so that their answer (a leader's, or
#: ``no-leader`` naming the cause) arrives, not a deadline of the gateway's own.
_UPSTREAM_TIMEOUT_S = DEFAULT_FAILOVER_S + 5.0
#: The signals that drain and stop ``percolake serve``.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How often a drain looks whether the open transactions have ended.
_DRAIN_POLL_S = 0.05


class StartupError(PercolakeError, ValueError):
    """``percolake serve`` cannot start as configured; the message begins with the flag
    to fix. Raised before the leader lease is touched."""


_SERVICE_NAMES = {
    "tso": timestamp_pb2.DESCRIPTOR.services_by_name["TimestampService"].full_name,
    "locks": lock_pb2.DESCRIPTOR.services_by_name["LockService"].full_name,
    "txn": transaction_pb2.DESCRIPTOR.services_by_name["TransactionService"].full_name,
}


@dataclass(frozen=True)
class ServeConfig:
    role: str = "all"
    store_url: str = DEFAULT_STORE
    listen: str = DEFAULT_LISTEN
    #: One address, or several (replicas) separated by commas.
    tso_address: str | None = None
    locks_address: str | None = None
    #: The leader lease of replicas on one store (rule S7).
    leader_lease_ms: int = DEFAULT_LEASE_MS
    token: str | None = None
    tls: TlsConfig | None = None
    client_tls: TlsConfig | None = None  # for the gateway's calls to tso and locks
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    lakehouse_limits: LakehouseLimits = field(default_factory=LakehouseLimits)
    txn_config: TransactionConfig = field(default_factory=TransactionConfig)
    grace_s: float = 30.0
    ready_file: str | None = None
    #: Garbage collection in the background: a pass every this many seconds (None: off).
    gc_interval_s: float | None = None
    gc_retention_s: float = 600.0
    #: ``HOST:PORT`` of the Prometheus metrics endpoint (None: off).
    metrics_listen: str | None = None
    #: Test builds only (``python -m percolake.chaos.serve``), to show that the checks
    #: catch what they break: commit steps other than ``COMMIT_STEPS``, oracles that do not
    #: claim their store (rule S7), and a gateway with test fail points. The installed
    #: command never sets them.
    commit_steps: tuple[str, ...] = COMMIT_STEPS
    oracle_claims: bool = True
    leader_checks_lease: bool = True
    #: Test builds only: opens the store (the chaos build models a store across a network).
    store_opener: Callable[[str], KVStore] = open_store
    #: ``serve locks --store URL``: lock server replicas, elected on the store.
    locks_on_store: bool = False
    gateway_class: type[TransactionServicer] = TransactionServicer
    lakehouse_class: type[LakehouseServicer] = LakehouseServicer

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}: expected one of {', '.join(ROLES)}")
        parse_address(self.listen)
        if self.role == "txn" and not (self.tso_address and self.locks_address):
            raise ValueError("'serve txn' needs --tso HOST:PORT and --locks HOST:PORT")
        for address in (self.tso_address, self.locks_address):
            if address is not None:
                parse_addresses(address)
        check_lease_ms(self.leader_lease_ms)
        if self.max_message_bytes < 1024:
            raise ValueError("max message size must be at least 1 KiB")
        if self.gc_interval_s is not None and self.gc_interval_s <= 0:
            raise ValueError(f"--gc-interval-s must be positive, got {self.gc_interval_s}")
        if self.gc_retention_s < 0:
            raise ValueError(f"--gc-retention-s must be >= 0, got {self.gc_retention_s}")
        if self.gc_interval_s is not None and self.role not in ("all", "txn"):
            raise ValueError("--gc-interval-s runs with a gateway: role all or txn")
        if self.metrics_listen is not None:
            _check_metrics_listen(self.metrics_listen, self.listen)


def store_opened(config: ServeConfig) -> bool:
    """Every role but a lone lock server opens the store."""
    return config.role != "locks" or config.locks_on_store


class RunningServer:
    """A started server and what must be closed after it stops, in order."""

    def __init__(self, config: ServeConfig, hurry: threading.Event | None = None) -> None:
        self.config = config
        self._closers: list[Callable[[], None]] = []
        self._gateway: TransactionServicer | None = None
        self.control: ControlPlane | None = None
        self._lakehouse: LakehouseServicer | None = None
        self._store: KVStore | None = None
        #: A split gateway's oracle and lock server, with the role each serves.
        self._upstreams: list[tuple[Connection, str]] = []
        self.stopped = threading.Event()
        #: Set by a second signal: end the drain now, aborting what is still open.
        self.hurry = hurry or threading.Event()
        self.metrics_port: int | None = None  # the metrics endpoint's, once serving
        # What can fail for a flag's sake is checked before the store is opened and the
        # leader lease touched: a replica that cannot serve must not take (and bump) it.
        _check_listen(config.listen)
        if config.metrics_listen is not None:
            self.metrics_port = self._serve_metrics(config.metrics_listen)
        options = [
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        interceptors: list[grpc.ServerInterceptor] = (
            [TokenInterceptor(config.token)] if config.token else []
        )
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=128, thread_name_prefix="percolake-rpc"),
            options=options,
            interceptors=interceptors,
        )
        try:
            names = self._add_services()
            self.port = self._add_port()
        except BaseException:
            # Fail before serving (a second oracle on the store, a port taken since
            # the check) without leaving the store or the metrics port open behind us.
            self._close_all()
            raise
        control_pb2_grpc.add_ControlServiceServicer_to_server(
            ControlServicer(
                role=config.role,
                store=config.store_url if store_opened(config) else "",
                address=lambda: self.address,
                control=self.control,
                open_transactions=self._open_transactions,
            ),
            self.server,
        )
        names.append(CONTROL_SERVICE)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        _enable_reflection(self.server, names)
        # Not serving until the first check below says otherwise (the servicer's
        # default for "" is SERVING).
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.start()
        host, _ = parse_address(config.listen)
        self.address = f"{host}:{self.port}"
        if self.control is not None:
            self.control.start(self.address)
        self.health_monitor = HealthMonitor(
            self.health, self._service_problems(names), always_serving=names
        )
        self._closers.insert(0, self.health_monitor.close)
        store = config.store_url if store_opened(config) else "-"
        log.info(
            "percolake %s serving on %s (store %s, tls %s, token %s)",
            config.role,
            self.address,
            store,
            "on" if config.tls else "off",
            "required" if config.token else "off",
        )
        if config.ready_file:
            Path(config.ready_file).write_text(f"{self.port}\n")

    def _add_port(self) -> int:
        listen, tls = self.config.listen, self.config.tls
        try:
            if tls is not None:
                port = self.server.add_secure_port(listen, tls.server_credentials())
            else:
                port = self.server.add_insecure_port(listen)
        except RuntimeError as exc:  # gRPC says only "Failed to bind"
            raise StartupError(f"--listen {listen}: cannot listen there ({exc})") from None
        if port == 0:
            raise StartupError(f"--listen {listen}: cannot listen there")
        return port

    def _serve_metrics(self, listen: str) -> int:
        host, port = parse_address(listen)
        try:
            metrics = MetricsServer(host, port)
        except OSError as exc:
            raise StartupError(
                f"--metrics-listen {listen}: cannot listen there: {exc.strerror or exc}"
            ) from None
        self._closers.append(metrics.close)
        log.info(
            "percolake %s metrics on http://%s:%d/metrics", self.config.role, host, metrics.port
        )
        return metrics.port

    def _service_problems(self, names: list[str]) -> dict[str, Callable[[], str | None]]:
        """For each service that depends on more than this process: why it cannot be
        served now (None: it can)."""
        problems: dict[str, Callable[[], str | None]] = {}
        control = self.control
        if control is not None:
            for role in ("tso", "locks"):
                if _SERVICE_NAMES[role] in names:
                    problems[_SERVICE_NAMES[role]] = control.serving_problem
        if self._gateway is not None:
            # Role all: the gateway's timestamps and locks come from the control plane,
            # which also reads the store every round. A split gateway (role txn) reads
            # its store and asks its oracle and lock server how they serve.
            gateway_problem = (
                control.serving_problem if control is not None else self._split_gateway_problem
            )
            problems[_SERVICE_NAMES["txn"]] = gateway_problem
            problems[LAKEHOUSE_SERVICE] = gateway_problem
        return problems

    def _split_gateway_problem(self) -> str | None:
        problem = self._store_problem()
        for conn, role in self._upstreams:
            if problem is not None:
                break
            problem = _upstream_problem(conn, role)
        return problem

    def _store_problem(self) -> str | None:
        store = self._store
        if store is None:
            return None
        try:
            store.get_system(LEADER_TABLE, [b"tso"])
        except StoreError as exc:
            return f"store unreachable: {exc}"
        except ValueError:  # closed: the server is stopping
            return "the store is closed"
        return None

    def _open_transactions(self) -> int:
        return 0 if self._gateway is None else self._gateway.open_transactions()

    def _open_store(self) -> KVStore:
        store = self.config.store_opener(self.config.store_url)
        self._closers.append(store.close)
        self._store = store
        return store

    def _add_services(self) -> list[str]:
        role, config = self.config.role, self.config
        names: list[str] = []
        store = self._open_store() if store_opened(config) else None
        plane: ControlPlane | TimestampOracle | None = None
        if role in ("all", "tso") or (role == "locks" and store is not None):
            assert store is not None
            if not config.oracle_claims and role != "locks":
                # The test build of two oracles on one store, each serving alone.
                plane = TimestampOracle(store, claim_store=False)
                self._closers.insert(0, plane.close)
            else:
                # Replicas on one store: the leader serves, the others forward (S7).
                plane = self.control = ControlPlane(
                    store,
                    role="locks" if role == "locks" else "tso",
                    lease_ms=config.leader_lease_ms,
                    token=config.token,
                    tls=config.client_tls,
                    check_lease=config.leader_checks_lease,
                )
                self._closers.insert(0, plane.close)
        if role in ("all", "tso"):
            assert plane is not None
            timestamp_pb2_grpc.add_TimestampServiceServicer_to_server(
                TimestampServicer(plane), self.server
            )
            names.append(_SERVICE_NAMES["tso"])
        table = plane if isinstance(plane, ControlPlane) else LockTable()
        # A replicated oracle (role tso) serves the locks of its term too: replicas of
        # roles all and tso elect on one row, and whichever leads is asked for both.
        if role in ("all", "locks") or (role == "tso" and isinstance(plane, ControlPlane)):
            lock_pb2_grpc.add_LockServiceServicer_to_server(LockServicer(table), self.server)
            names.append(_SERVICE_NAMES["locks"])
        if role in ("all", "txn"):
            assert store is not None
            timestamps: TimestampSource
            locks: LockService
            if role == "all":
                if isinstance(plane, ControlPlane):
                    timestamps, locks = plane, plane
                else:
                    assert isinstance(plane, TimestampOracle)
                    timestamps, locks = TimestampBatcher(plane.next_range), table
                manager = TransactionManager(
                    store, timestamps, locks, config.txn_config, commit_steps=config.commit_steps
                )
            else:
                assert config.tso_address and config.locks_address
                tso_conn = Connection(config.tso_address, token=config.token, tls=config.client_tls)
                locks_conn = Connection(
                    config.locks_address, token=config.token, tls=config.client_tls
                )
                self._closers += [tso_conn.close, locks_conn.close]
                self._upstreams = [(tso_conn, "tso"), (locks_conn, "locks")]
                timestamps = RemoteTimestampSource(tso_conn, timeout_s=_UPSTREAM_TIMEOUT_S)
                locks = RemoteLockService(locks_conn, timeout_s=_UPSTREAM_TIMEOUT_S)
                manager = TransactionManager(
                    store, timestamps, locks, config.txn_config, commit_steps=config.commit_steps
                )
            self._closers.insert(0, manager.close)
            if config.gc_interval_s is not None:
                collector = GarbageCollector(
                    store,
                    timestamps=timestamps,
                    locks=locks,
                    retention_s=config.gc_retention_s,
                    config=config.txn_config,
                )
                self._closers.insert(0, GcLoop(collector, config.gc_interval_s).close)
            self._gateway = config.gateway_class(manager, config.limits)
            transaction_pb2_grpc.add_TransactionServiceServicer_to_server(
                self._gateway, self.server
            )
            names.append(_SERVICE_NAMES["txn"])
            self._lakehouse = serve_lakehouse(
                manager, self.server, config.lakehouse_limits, config.lakehouse_class
            )
            names.append(LAKEHOUSE_SERVICE)
        return names

    def _close_all(self) -> None:
        for close in self._closers:
            close()
        self._closers.clear()

    def stop(self) -> None:
        """Drain, then stop: admit no new transaction (Begin answers "draining": go to
        another replica), give open transactions up to ``grace_s`` to commit or abort
        (in-flight calls finish within what is left of it), abort what is still open,
        close the store and release the leader lease. Idempotent."""
        if self.stopped.is_set():
            return
        deadline = time.monotonic() + self.config.grace_s
        self._drain(deadline)
        self.health.enter_graceful_shutdown()
        self.server.stop(max(0.0, deadline - time.monotonic())).wait()
        if self._gateway is not None:
            self._gateway.shutdown()
        if self._lakehouse is not None:
            self._lakehouse.shutdown()
        self._close_all()
        log.info("percolake %s on %s stopped", self.config.role, self.address)
        self.stopped.set()

    def _drain(self, deadline: float) -> None:
        """Refuse new transactions and wait (bounded by ``deadline``) for the open ones."""
        # Load balancers and probes of the services see NOT_SERVING from now on.
        self.health_monitor.drain()
        if self._gateway is None:
            return
        self._gateway.drain(
            f"gateway {self.address} is shutting down and begins no new transaction: "
            "begin it on another replica"
        )
        open_now = self._gateway.open_transactions()
        if open_now:
            log.info(
                "draining: %d open transactions have up to %.1f s to commit or abort",
                open_now,
                max(0.0, deadline - time.monotonic()),
            )
        while self._gateway.open_transactions() and not self.hurry.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.hurry.wait(min(_DRAIN_POLL_S, left))
        still_open = self._gateway.open_transactions()
        if still_open:
            log.info("drain over: aborting %d transactions still open", still_open)
        elif open_now:
            log.info("drained: every open transaction ended")


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


def _upstream_problem(conn: Connection, role: str) -> str | None:
    """Why the oracle or lock server a split gateway calls cannot serve (None: it can),
    by its own health check."""
    check = conn.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    try:
        got = check(
            health_pb2.HealthCheckRequest(service=_SERVICE_NAMES[role]),
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


#: How long a split gateway's health check waits for its oracle's or lock server's.
_UPSTREAM_CHECK_TIMEOUT_S = 1.0

#: How often :class:`HealthMonitor` checks: a fraction of the default lease, so that
#: health follows a lease that runs out or a store that stops answering within a round.
HEALTH_INTERVAL_S = 0.25


def _cause_kind(problem: str) -> str:
    """A problem without its durations (they grow at every check), to log a cause once."""
    return re.sub(r"\d+(\.\d+)? s\b", "N s", problem)


def _check_metrics_listen(metrics_listen: str, listen: str) -> None:
    try:
        host, port = parse_address(metrics_listen)
    except ValueError as exc:
        raise ValueError(f"--metrics-listen: {exc}") from None
    if port != 0 and (host, port) == parse_address(listen):
        raise ValueError(f"--metrics-listen {metrics_listen} is the gRPC address (--listen)")


def _check_listen(listen: str) -> None:
    """``--listen`` names a port this process can bind now: the cause in one line
    (gRPC reports any failure as "Failed to bind"). Port 0 always can."""
    host, port = parse_address(listen)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"--listen {listen}: cannot resolve {host!r}: {exc}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As gRPC binds: a port in TIME_WAIT is fine, one something listens on is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise StartupError(f"--listen {listen}: {exc.strerror or exc}") from None


def check_tls_files(cert: str | None, key: str | None, client_ca: str | None) -> TlsConfig:
    """The server's TLS material, read and checked now (the key matches the
    certificate, the CA parses); :class:`StartupError` naming the flag otherwise."""
    if not (cert and key):
        missing = "--tls-key" if cert else "--tls-cert"
        raise StartupError(f"{missing}: TLS needs both --tls-cert and --tls-key")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", client_ca)):
        if path is None:
            continue
        try:
            Path(path).read_bytes()
        except OSError as exc:
            raise StartupError(f"{flag} {path}: cannot read it: {exc.strerror}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # An encrypted key would make OpenSSL prompt on the terminal; gRPC cannot use
        # one either, so the empty password fails it here with a reason.
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise StartupError(
                f"--tls-key {key}: does not match the certificate --tls-cert {cert}"
            ) from None
        raise StartupError(
            f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its "
            f"unencrypted key ({exc.reason or exc})"
        ) from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except ssl.SSLError as exc:
            raise StartupError(
                f"--tls-client-ca {client_ca}: not a PEM CA certificate ({exc.reason or exc})"
            ) from None
    tls = TlsConfig(cert, key, client_ca)
    tls.server_credentials()  # what gRPC will read
    return tls


def serve(config: ServeConfig) -> int:
    """Run until SIGTERM, SIGINT or SIGHUP, then drain (:meth:`RunningServer.stop`) and
    exit 0. SIGHUP drains too: a hang-up should not leave the lease to run out. A
    second signal during the drain ends it at once."""
    stop_requested, hurry = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop_requested.is_set():
            log.info("received %s again; ending the drain now", name)
            hurry.set()
            return
        log.info("received %s; draining for up to %.1f s, then stopping", name, config.grace_s)
        stop_requested.set()

    # Before the server starts: a signal as soon as it is ready (its ready file
    # written) must find the handler, not kill the process with the lease held.
    for signum in _STOP_SIGNALS:
        signal.signal(signum, on_signal)
    running = RunningServer(config, hurry)
    stop_requested.wait()
    running.stop()
    # Stopped: nothing is left to drain. Python restores the default handlers while it
    # shuts down, and a late signal would then end a clean stop with -SIGTERM instead
    # of 0; ignored signals are left ignored.
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    return 0


# --- the command line of ``percolake serve`` (its arguments: percolake.serve_args) ---

#: ``percolake serve`` could not start: another oracle already serves the store (S7).
EXIT_STORE_IN_USE = 3
#: ``percolake serve`` could not start as configured (a flag's TLS files, ports).
EXIT_BAD_FLAG = 2


#: Server reflection as grpcurl and newer clients ask for it first. grpcio-reflection
#: serves only ``grpc.reflection.v1alpha``; the ``v1`` protocol is the same proto under
#: another package (every message and field number alike), so the same servicer answers
#: both, and v1's file is v1alpha's with its name and package changed.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_REFLECTION_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _enable_reflection(server: grpc.Server, names: list[str]) -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_REFLECTION_V1_FILE)  # registered already (a newer library)
    except KeyError:
        alpha = descriptor_pb2.FileDescriptorProto()
        reflection_pb2.DESCRIPTOR.CopyToProto(alpha)
        # The package, every type reference to it and the language options.
        text = text_format.MessageToString(alpha).replace("v1alpha", "v1")
        v1 = text_format.Parse(text, descriptor_pb2.FileDescriptorProto())
        v1.name = _REFLECTION_V1_FILE
        v1.options.ClearField("deprecated")
        pool.Add(v1)
    servicer = reflection.ReflectionServicer([*names, reflection.SERVICE_NAME, REFLECTION_V1])
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for service in (reflection.SERVICE_NAME, REFLECTION_V1):
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"ServerReflectionInfo": handler}),)
        )


def serve_from_args(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    *,
    commit_steps: tuple[str, ...] = COMMIT_STEPS,
    oracle_claims: bool = True,
    leader_checks_lease: bool = True,
    store_opener: Callable[[str], KVStore] = open_store,
    gateway_class: type[TransactionServicer] = TransactionServicer,
    lakehouse_class: type[LakehouseServicer] = LakehouseServicer,
) -> int:
    """Validate the arguments (exit 2 naming the problem, before listening) and serve.

    ``commit_steps``, ``oracle_claims``, ``leader_checks_lease``, ``store_opener``,
    ``gateway_class`` and ``lakehouse_class`` exist for the chaos test build only; see
    :class:`ServeConfig`.
    """
    try:
        tls = None
        if args.tls_cert or args.tls_key or args.tls_client_ca:
            tls = check_tls_files(args.tls_cert, args.tls_key, args.tls_client_ca)
        config = ServeConfig(
            role=args.role,
            store_url=args.store or DEFAULT_STORE,
            listen=args.listen or DEFAULT_LISTEN,
            locks_on_store=args.role == "locks" and args.store is not None,
            leader_lease_ms=args.leader_lease_ms,
            tso_address=args.tso,
            locks_address=args.locks,
            token=resolve_token(token_file=args.token_file),
            tls=tls,
            client_tls=TlsConfig(ca_file=args.tls_ca) if args.tls_ca else None,
            max_message_bytes=args.max_message_mb * 1024 * 1024,
            limits=GatewayLimits(
                max_buffered_writes=args.max_writes_per_txn,
                max_open_transactions=args.max_open_txns,
                idle_timeout_s=args.idle_timeout_s,
            ),
            lakehouse_limits=LakehouseLimits(
                max_group_commits=args.max_group_commits,
                max_group_bytes=args.max_group_kb * 1024,
                max_group_wait_ms=args.max_group_wait_ms,
            ),
            txn_config=TransactionConfig(
                lease_ms=args.lease_ms,
                lock_wait_ms=args.lock_wait_ms,
                resolve_wait_ms=args.resolve_wait_ms,
            ),
            grace_s=args.grace_s,
            ready_file=args.ready_file,
            gc_interval_s=args.gc_interval_s,
            gc_retention_s=args.gc_retention_s,
            metrics_listen=args.metrics_listen,
            commit_steps=commit_steps,
            oracle_claims=oracle_claims,
            leader_checks_lease=leader_checks_lease,
            store_opener=store_opener,
            gateway_class=gateway_class,
            lakehouse_class=lakehouse_class,
        )
    except StartupError as exc:
        sys.stderr.write(f"percolake serve: {exc}\n")
        return EXIT_BAD_FLAG
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return serve(config)
    except StartupError as exc:
        sys.stderr.write(f"percolake serve: {exc}\n")
        return EXIT_BAD_FLAG
    except OracleAlreadyRunningError as exc:
        sys.stderr.write(f"percolake serve: {exc}\n")
        return EXIT_STORE_IN_USE
