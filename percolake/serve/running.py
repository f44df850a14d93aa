"""A running ``percolake serve``: the services its role composes on one gRPC server,
what they need (store, control plane, upstream connections) and the drain that stops
them (docs/design/gateway.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lockserver import LockTable
from lockserver.lock_service import LockServicer, RemoteLockService
from percolake.serve.config import ServeConfig, store_opened
from percolake.serve.health import ROLE_SERVICES, HealthMonitor, upstream_problem
from percolake.serve.reflection import enable_reflection
from percolake.serve.replica import ControlPlane
from percolake.serve.startup import StartupError, check_listen
from percolake.serve.status import SERVICE_NAME as CONTROL_SERVICE
from percolake.serve.status import ControlServicer
from percolake.serve.testing import TestBuild
from spark_integration.service import SERVICE_NAME as LAKEHOUSE_SERVICE
from spark_integration.service import LakehouseServicer, serve_lakehouse
from storage_adapters import KVStore, StoreError
from tso import DEFAULT_LEADER_WAIT_S, LEADER_TABLE, TimestampBatcher, TimestampOracle
from tso.timestamp_service import RemoteTimestampSource, TimestampServicer
from txn import GarbageCollector, GcLoop, LockService, TimestampSource, TransactionManager
from txn.gateway import TransactionServicer
from wire.auth import TokenInterceptor
from wire.channels import Connection, parse_address
from wire.metrics import MetricsServer
from wire.v1 import control_pb2_grpc, lock_pb2_grpc, timestamp_pb2_grpc, transaction_pb2_grpc

# The name operators filter on (docs/operations.md) since serve was one module.
log = logging.getLogger("percolake.server")

#: How long a split-role gateway waits for the oracle and the lock server, beyond how
#: long their replicas wait for a leader (the default, or this gateway's
#: ``--leader-wait-s`` if longer), so that their answer (a leader's, or ``no-leader``
#: naming the cause) arrives, not a deadline of the gateway's own.
_UPSTREAM_MARGIN_S = 5.0
#: How often a drain looks whether the open transactions have ended.
_DRAIN_POLL_S = 0.05


def upstream_timeout_s(config: ServeConfig) -> float:
    """How long a split-role gateway waits for a call to the oracle or lock server: past
    the longest wait for a leader its replicas may have (the default, or this
    gateway's ``--leader-wait-s``), so their answer arrives, not our own deadline."""
    return max(DEFAULT_LEADER_WAIT_S, config.leader_wait_s) + _UPSTREAM_MARGIN_S


class RunningServer:
    """A started server and what must be closed after it stops, in order.

    ``build`` is what a test build changes (:class:`~percolake.serve.testing.TestBuild`);
    the installed command passes none.
    """

    def __init__(
        self,
        config: ServeConfig,
        hurry: threading.Event | None = None,
        build: TestBuild | None = None,
    ) -> None:
        self.config = config
        self.build = TestBuild() if build is None else build
        self._closers: list[Callable[[], None]] = []
        self._gateway: TransactionServicer | None = None
        self.control: ControlPlane | None = None
        #: The lock table a lone lock server (no replicas) serves, for its status.
        self._lock_table: LockTable | None = None
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
        check_listen(config.listen)
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
                lock_table=self._lock_table,
            ),
            self.server,
        )
        names.append(CONTROL_SERVICE)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        enable_reflection(self.server, names)
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
                if ROLE_SERVICES[role] in names:
                    problems[ROLE_SERVICES[role]] = control.serving_problem
        if self._gateway is not None:
            # Role all: the gateway's timestamps and locks come from the control plane,
            # which also reads the store every round. A split gateway (role txn) reads
            # its store and asks its oracle and lock server how they serve.
            gateway_problem = (
                control.serving_problem if control is not None else self._split_gateway_problem
            )
            problems[ROLE_SERVICES["txn"]] = gateway_problem
            problems[LAKEHOUSE_SERVICE] = gateway_problem
        return problems

    def _split_gateway_problem(self) -> str | None:
        problem = self._store_problem()
        for conn, role in self._upstreams:
            if problem is not None:
                break
            problem = upstream_problem(conn, role)
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
        store = self.build.store_opener(self.config.store_url)
        self._closers.append(store.close)
        self._store = store
        return store

    def _add_services(self) -> list[str]:
        role, config, build = self.config.role, self.config, self.build
        names: list[str] = []
        store = self._open_store() if store_opened(config) else None
        plane: ControlPlane | TimestampOracle | None = None
        if role in ("all", "tso") or (role == "locks" and store is not None):
            assert store is not None
            if not build.oracle_claims and role != "locks":
                # The test build of two oracles on one store, each serving alone.
                plane = TimestampOracle(store, claim_store=False)
                self._closers.insert(0, plane.close)
            else:
                # Replicas on one store: the leader serves, the others forward (S7).
                plane = self.control = ControlPlane(
                    store,
                    role="locks" if role == "locks" else "tso",
                    lease_ms=config.leader_lease_ms,
                    failover_s=config.leader_wait_s,
                    token=config.token,
                    tls=config.client_tls,
                    check_lease=build.leader_checks_lease,
                )
                self._closers.insert(0, plane.close)
        if role in ("all", "tso"):
            assert plane is not None
            timestamp_pb2_grpc.add_TimestampServiceServicer_to_server(
                TimestampServicer(plane), self.server
            )
            names.append(ROLE_SERVICES["tso"])
        table = plane if isinstance(plane, ControlPlane) else LockTable()
        # A replicated oracle (role tso) serves the locks of its term too: replicas of
        # roles all and tso elect on one row, and whichever leads is asked for both.
        if role in ("all", "locks") or (role == "tso" and isinstance(plane, ControlPlane)):
            lock_pb2_grpc.add_LockServiceServicer_to_server(LockServicer(table), self.server)
            if isinstance(table, LockTable):
                self._lock_table = table
            names.append(ROLE_SERVICES["locks"])
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
                    store, timestamps, locks, config.txn_config, commit_steps=build.commit_steps
                )
            else:
                assert config.tso_address and config.locks_address
                tso_conn = Connection(config.tso_address, token=config.token, tls=config.client_tls)
                locks_conn = Connection(
                    config.locks_address, token=config.token, tls=config.client_tls
                )
                self._closers += [tso_conn.close, locks_conn.close]
                self._upstreams = [(tso_conn, "tso"), (locks_conn, "locks")]
                upstream_s = upstream_timeout_s(config)
                timestamps = RemoteTimestampSource(tso_conn, timeout_s=upstream_s)
                locks = RemoteLockService(locks_conn, timeout_s=upstream_s)
                manager = TransactionManager(
                    store, timestamps, locks, config.txn_config, commit_steps=build.commit_steps
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
            self._gateway = build.gateway_class(manager, config.limits)
            transaction_pb2_grpc.add_TransactionServiceServicer_to_server(
                self._gateway, self.server
            )
            names.append(ROLE_SERVICES["txn"])
            self._lakehouse = serve_lakehouse(
                manager, self.server, config.lakehouse_limits, build.lakehouse_class
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
        # Begin is refused first: it is what the drain promises, and the health round
        # below runs the services' probes, which a loaded store can make slow.
        if self._gateway is not None:
            self._gateway.drain(
                f"gateway {self.address} is shutting down and begins no new transaction: "
                "begin it on another replica"
            )
        # Load balancers and probes of the services see NOT_SERVING from now on.
        self.health_monitor.drain()
        if self._gateway is None:
            return
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
