"""The cluster of a chaos run: store, oracle, lock server, gateways and clients.

Each is a real process on loopback. With ``--replicas N`` the oracle and the lock
server are N replicas of ``percolake serve`` (role all) on the store instead, one of
which leads; gateways and clients get every replica's address and fail over between
them by themselves. Restarted servers come back on their old port,
so clients and gateways reconnect on their own. Clients are numbered Jepsen-style: a
client slot whose process was killed comes back as a new process number
(``slot + clients * generation``), so the killed process's last operation stays open
in the history and is recorded as unknown. With ``--warehouse s3`` the run also starts
a MinIO of its own in its work folder (the lakehouse table's bucket), the target of the
``s3-pause`` and ``s3-kill`` faults.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from percolake.tools.chaos._config import (
    BROKEN_PROTOCOL_ENV,
    LEADER_IGNORES_LEASE_ENV,
    NO_ORACLE_CLAIM_ENV,
    TEST_GC_GRACE_ENV,
    RunConfig,
)
from percolake.tools.chaos._leader_metrics import LeaderMetricsWatch
from percolake.tools.chaos._ops import Phase
from percolake.tools.chaos._procs import (
    Managed,
    PidRegistry,
    Service,
    start_together,
    stop_together,
)
from percolake.tools.chaos._reconnect import STORE_RECONNECT_ENV
from percolake.tools.chaos._replicas import LeaderWatch
from percolake.tools.ports import free_ports
from tso import LeaseRecord
from txn import TransactionManager

log = logging.getLogger(__name__)

#: Group ids that tell the processes of a run apart in ``iptables -m owner`` rules.
GID_TSO: Final = 60_001
GID_LOCKS: Final = 60_002
GID_GATEWAY_BASE: Final = 61_000
GID_CLIENT_BASE: Final = 62_000
GID_CASSANDRA_BASE: Final = 63_000
GID_REPLICA_BASE: Final = 64_000
GID_EMBEDDED: Final = 65_000
#: How the report names the embedded oracle (``--embedded``); its leader row has no address.
EMBEDDED_NAME: Final = "embedded"

#: Cassandra node settings for a loaded machine: a two-core box running three nodes
#: and a dozen Python processes stalls for longer than the default 2 s timeouts.
CASSANDRA_YAML: Final[dict[str, Any]] = {
    "write_request_timeout": "5000ms",
    "cas_contention_timeout": "5000ms",
    "read_request_timeout": "10000ms",
    "range_request_timeout": "10000ms",
    "truncate_request_timeout": "60000ms",
}
KEYSPACE: Final = "chaos"
#: MinIO starts in 1-2 s; a machine busy starting a dozen processes may take far longer.
S3_STARTUP_TIMEOUT_S: Final = 120.0
#: The bucket of the run's MinIO that holds the lakehouse warehouse.
S3_BUCKET: Final = "chaos"
#: How long the clients of a run may take to start (imports, connections) before the
#: run's clock starts without the slow ones.
CLIENT_READY_TIMEOUT_S: Final = 120.0
#: ``%-5level [%thread] %date{ISO8601} %F:%L - %msg``: the launcher's logback pattern.
_LOG_ENTRY: Final = re.compile(
    r"^(?P<level>WARN|ERROR)\s+\[[^\]]*\]\s+(?P<when>\S+ \S+)\s+(?P<source>\S+) - (?P<message>.*)$"
)
_NUMBERED_THREAD: Final = re.compile(r"\b([A-Za-z]+Stage|Requests)-\d+")


@dataclass(slots=True)
class ClientSlot:
    slot: int
    mode: str
    generation: int = 0
    #: The oracle this slot's process talks to, when not the cluster's (oracle overlap,
    #: a timestamps client pinned to one replica).
    tso: str | None = None
    proc: Managed | None = None
    phase: Phase | None = None
    events: list[Path] = field(default_factory=list)


class Cluster:
    def __init__(
        self, config: RunConfig, work_dir: Path, registry: PidRegistry, *, isolated: bool
    ) -> None:
        self.config = config
        self.work = work_dir
        self.registry = registry
        #: In the run's own namespace: fixed ports are free and group ids tag processes.
        self.isolated = isolated
        self.cassandra: Any = None  # percolake.tools.cassandra.CassandraCluster
        self.store_url = ""
        self.tso_store_url = ""
        self.warehouse = str(work_dir / "warehouse")
        #: The run's own MinIO (``--warehouse s3``): a ``percolake.tools.s3.S3Server``.
        self.s3: Any = None
        self.tso: Service | None = None
        self.locks: Service | None = None
        #: The replicated control plane (``--replicas``), instead of ``tso`` and ``locks``.
        self.replicas: list[Service] = []
        #: The embedded oracle beside the replicas (``--embedded``).
        self.embedded: Service | None = None
        self.leader_watch: LeaderWatch | None = None
        #: Each replica's metrics port (kept across its restarts), and their scraper.
        self.metrics_ports: dict[str, int] = {}
        self.leader_metrics: LeaderMetricsWatch | None = None
        self.gateways: list[Service] = []
        #: Second oracles started next to the first (oracle-overlap faults).
        self.second_oracles: list[Service] = []
        self.clients: list[ClientSlot] = []
        #: process -> time of its SIGKILL (ns since t0): its open operation is unknown.
        self.crashed: dict[int, int] = {}
        self.t0_ns = 0
        self.until_ns = 0
        (work_dir / "clients").mkdir(parents=True, exist_ok=True)

    # --- store ---------------------------------------------------------------------

    def start_store(self) -> None:
        c = self.config
        if c.cassandra_nodes:
            from percolake.tools.cassandra import CassandraCluster, start_on_free_ports

            options: dict[str, Any] = {
                "cluster_name": "percolake-chaos",
                "heap_mb": c.cassandra_heap_mb,
                "extra_yaml": CASSANDRA_YAML,
            }
            base_dir = self.work / "cassandra"
            log.info("starting %d Cassandra node(s)", c.cassandra_nodes)
            if self.isolated:
                # Each node in a namespace of its own, on the default ports. One by one,
                # each under its own group id (see start_cassandra_node); start() then
                # records the layout and waits until the ring has formed.
                self.cassandra = CassandraCluster(c.cassandra_nodes, base_dir, **options)
                for index in range(1, c.cassandra_nodes + 1):
                    self.start_cassandra_node(index)
                self.cassandra.start()
            else:
                self.cassandra = start_on_free_ports(c.cassandra_nodes, base_dir, **options)
            rf = min(3, c.cassandra_nodes)
            self.store_url = self.cassandra.store_url(KEYSPACE, replication_factor=rf)
            self.tso_store_url = self.store_url
        elif c.store_url is not None and c.store_url.startswith("cassandra://"):
            self.store_url = self.tso_store_url = c.store_url
        else:
            self.store_url = c.store_url or f"sqlite:///{self.work / 'data.db'}"
            # Replicas (role all) keep the oracle's bound and the leader row in the store
            # they serve; a lone oracle keeps them in a file of its own.
            self.tso_store_url = (
                self.store_url if c.replicas else f"sqlite:///{self.work / 'tso.db'}"
            )
        from storage_adapters import open_store

        open_store(self.store_url).close()  # creates the keyspace once, before anyone races
        self.leader_watch = LeaderWatch(self.tso_store_url)

    def start_s3(self) -> None:
        """With ``--warehouse s3``: start MinIO in the work folder and put the warehouse
        in a bucket there.

        Its AWS variables go into this process's environment (the harness's setup and
        final read reach the bucket through the file-system layer, which reads them
        there) and into every gateway, replica and client it starts (:meth:`_s3_env`).
        """
        if self.config.warehouse != "s3":
            return
        from percolake.tools.s3 import S3Server

        self.s3 = S3Server(self.work / "s3", startup_timeout_s=S3_STARTUP_TIMEOUT_S)
        self.s3.start()
        os.environ.update(self.s3.env())
        self.s3.create_bucket(S3_BUCKET)
        self.warehouse = f"s3://{S3_BUCKET}/warehouse"
        log.info("MinIO on %s; warehouse %s", self.s3.endpoint_url, self.warehouse)

    def _s3_env(self) -> dict[str, str]:
        """The AWS variables of the run's MinIO (none without one)."""
        return dict(self.s3.env()) if self.s3 is not None else {}

    def heal_s3(self) -> str | None:
        """Resume a paused MinIO or start a killed one again (same data, same port)."""
        if self.s3 is None:
            return None
        if self.s3.alive():
            self.s3.resume()  # SIGCONT: nothing happens to a server that runs
            return None
        self.s3.start()
        return "restarted s3"

    @property
    def cassandra_nodes(self) -> list[int]:
        """Indexes of the Cassandra nodes this run owns (and may kill)."""
        return list(range(1, self.config.cassandra_nodes + 1)) if self.cassandra else []

    def start_cassandra_node(self, index: int) -> None:
        """Start one node, in the run's namespace under a group id of its own.

        Cassandra connects to its peers from 127.0.0.1 whatever its listen address,
        so only the sending process tells one node's packets from another's:
        ``iptables -m owner --gid-owner``. The node inherits the group this process
        has while it spawns the node.
        """
        assert self.cassandra is not None
        if not self.isolated:
            self.cassandra.start_node(index)
            return
        saved = os.getresgid()
        gid = GID_CASSANDRA_BASE + index
        os.setresgid(gid, gid, gid)
        try:
            self.cassandra.start_node(index)
        finally:
            os.setresgid(*saved)

    def cassandra_address(self, index: int) -> str:
        assert self.cassandra is not None
        address: str = self.cassandra.layout.address(index)
        return address

    # --- servers -------------------------------------------------------------------

    def _gid(self, gid: int) -> int | None:
        return gid if self.isolated else None

    def _broken_env(self) -> dict[str, str]:
        """The test build's switches, for gateways, replicas and clients."""
        grace_ms = self.config.gc_grace_ms
        return {
            BROKEN_PROTOCOL_ENV: "1" if self.config.unsafe_broken_protocol else "",
            TEST_GC_GRACE_ENV: "" if grace_ms is None else str(grace_ms),
        }

    def _oracle_env(self) -> dict[str, str]:
        c = self.config
        return {
            NO_ORACLE_CLAIM_ENV: "1" if c.unsafe_no_oracle_claim else "",
            LEADER_IGNORES_LEASE_ENV: "1" if c.unsafe_leader_ignores_lease else "",
            STORE_RECONNECT_ENV: str(c.store_reconnect_ms) if c.store_reconnect_ms else "",
        }

    def _oracle(self, name: str) -> Service:
        return Service(
            name,
            "percolake.tools.chaos.serve tso",
            [
                "--store",
                self.tso_store_url,
                "--leader-lease-ms",
                str(self.config.leader_lease_ms),
            ],
            self.work,
            self.registry,
            env=self._oracle_env(),
            gid=self._gid(GID_TSO),
        )

    def _gateway_args(self) -> list[str]:
        """What every gateway (``serve txn``, and the one in each replica) is given."""
        c = self.config
        return [
            "--idle-timeout-s",
            str(c.idle_timeout_s),
            "--lease-ms",
            str(c.lease_ms),
            "--lock-wait-ms",
            str(c.lock_wait_ms),
            "--resolve-wait-ms",
            str(c.resolve_wait_ms),
            *(
                []
                if c.gc_interval_s is None
                else [
                    "--gc-interval-s",
                    str(c.gc_interval_s),
                    "--gc-retention-s",
                    str(c.gc_retention_s),
                ]
            ),
        ]

    def _replica(self, index: int) -> Service:
        """Replica ``index`` of ``percolake serve`` (role all) on the store, not started."""
        name = f"replica-{index}"
        if name not in self.metrics_ports:
            (self.metrics_ports[name],) = free_ports(1)
        return Service(
            name,
            "percolake.tools.chaos.serve all",
            [
                "--store",
                self.store_url,
                "--leader-lease-ms",
                str(self.config.leader_lease_ms),
                "--metrics-listen",
                f"127.0.0.1:{self.metrics_ports[name]}",
                *self._gateway_args(),
            ],
            self.work,
            self.registry,
            env={**self._broken_env(), **self._oracle_env(), **self._s3_env()},
            gid=self._gid(GID_REPLICA_BASE + index),
        )

    def _embedded(self) -> Service:
        """The embedded oracle on the replicas' store, not started."""
        return Service(
            EMBEDDED_NAME,
            "percolake.tools.chaos.embedded",
            ["--store", self.store_url, "--leader-lease-ms", str(self.config.leader_lease_ms)],
            self.work,
            self.registry,
            env=self._oracle_env(),
            gid=self._gid(GID_EMBEDDED),
        )

    @property
    def tso_address(self) -> str:
        """Where clients and gateways ask for timestamps: the oracle, or every replica."""
        if self.replicas:
            return ",".join(r.address for r in self.replicas)
        assert self.tso is not None
        return self.tso.address

    @property
    def locks_address(self) -> str:
        """Where clients and gateways take locks: the lock server, or every replica."""
        if self.replicas:
            return self.tso_address
        assert self.locks is not None
        return self.locks.address

    def replica_at(self, address: str) -> Service | None:
        """The replica serving on ``address`` (as the leader row names it); the embedded
        oracle for a row without an address (it advertises none)."""
        if address == "" and self.embedded is not None:
            return self.embedded
        return next((r for r in self.replicas if r.port and r.address == address), None)

    def leader(self, wait_s: float) -> tuple[Service, LeaseRecord]:
        """The replica that leads now and its row; waits up to ``wait_s`` for one (an
        election under way). ``RuntimeError`` when none leads by then."""
        assert self.leader_watch is not None
        deadline = time.monotonic() + wait_s
        last: LeaseRecord | None = None
        while True:
            last = self.leader_watch.live_leader()
            if last is not None:
                replica = self.replica_at(last.address)
                if replica is not None and replica.alive and not replica.paused:
                    return replica, last
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no replica leads after {wait_s:.0f} s (leader row: {last})")
            time.sleep(0.05)

    def replica_names(self) -> dict[str, str]:
        """Replica name by address, for the report (the embedded oracle by its address,
        and by the empty address its leader row carries)."""
        names = {r.address: r.name for r in self.replicas if r.port}
        if self.embedded is not None and self.embedded.port:
            names[self.embedded.address] = names[""] = EMBEDDED_NAME
        return names

    def second_oracle(self) -> Service:
        """A second oracle on the oracle's store, not started yet (on a port of its own)."""
        oracle = self._oracle(f"tso-overlap-{len(self.second_oracles)}")
        self.second_oracles.append(oracle)
        return oracle

    def start_services(self) -> None:
        c = self.config
        if c.replicas:
            if c.embedded:
                # First, on the fresh store: it leads, as an embedded manager started
                # before the replicas does; they follow.
                self.embedded = self._embedded().start()
            # Distinct metrics ports, picked before any replica binds one.
            ports = free_ports(c.replicas)
            self.metrics_ports = {f"replica-{i}": port for i, port in enumerate(ports)}
            # The first alone: it leads at once on a fresh store; the others then start
            # side by side and follow.
            self.replicas.append(self._replica(0).start())
            self.replicas += start_together([self._replica(i) for i in range(1, c.replicas)])
        else:
            locks = Service(
                "locks",
                "percolake serve locks",
                [],
                self.work,
                self.registry,
                gid=self._gid(GID_LOCKS),
            )
            self.tso, self.locks = start_together([self._oracle("tso"), locks])
        # The timestamps workload asks the oracle only: no gateways. They need the
        # oracle's address, so they start after it, side by side.
        gateways = [
            Service(
                f"gateway-{i}",
                "percolake.tools.chaos.serve txn",
                [
                    "--store",
                    self.store_url,
                    "--tso",
                    self.tso_address,
                    "--locks",
                    self.locks_address,
                    *self._gateway_args(),
                ],
                self.work,
                self.registry,
                env={**self._broken_env(), **self._s3_env()},
                gid=self._gid(GID_GATEWAY_BASE + i),
            )
            for i in range(c.gateways if c.uses_transactions else 0)
        ]
        self.gateways = start_together(gateways)
        log.info(
            "oracle %s, lock server %s, gateways %s",
            self.tso_address,
            self.locks_address,
            ",".join(g.address for g in self.gateways) or "none",
        )

    def services(self) -> dict[str, Service]:
        named: dict[str, Service] = {r.name: r for r in self.replicas}
        if self.embedded is not None:
            named[self.embedded.name] = self.embedded
        if self.tso is not None:
            named["tso"] = self.tso
        if self.locks is not None:
            named["locks"] = self.locks
        named.update({g.name: g for g in self.gateways})
        return named

    def direct_manager(self) -> TransactionManager:
        from percolake.tools.chaos.client import direct_manager

        tso = self.tso_address
        if self.embedded is not None and self.embedded.alive and self.embedded.port:
            # Replicas cannot forward to an embedded leader (docs/design/limits.md):
            # while it may lead, ask it first; it redirects when a replica leads.
            tso = f"{self.embedded.address},{tso}"
        return direct_manager(
            self.store_url,
            tso,
            self.locks_address,
            self.config,
            timeout_s=self.config.client_timeout_s,
        )

    # --- clients -------------------------------------------------------------------

    def client_mode(self, slot: int) -> str:
        if not self.config.uses_transactions:
            return "timestamps"
        # Half the clients go through the gateways (the deployed topology: every
        # workload, lakehouse included, since Lakehouse takes any txn.Manager), half
        # run the protocol in their own process. With replicas, every other one of the
        # former goes through the replicas' own gateways instead.
        if slot % 2 == 1:
            return "direct"
        return "replicas" if self.replicas and slot % 4 == 2 else "remote"

    def pinned_tso(self, slot: int) -> str | None:
        """Timestamps workload: the one replica an even slot asks, by its address (so
        that a replica waking from a pause is asked directly); odd slots ask them all."""
        if self.config.uses_transactions or not self.replicas or slot % 2 == 1:
            return None
        pinned = [*([self.embedded] if self.embedded is not None else []), *self.replicas]
        return pinned[(slot // 2) % len(pinned)].address

    @property
    def start_file(self) -> Path:
        """``T0_NS UNTIL_NS``, written once every client is ready; clients wait for it."""
        return self.work / "clients" / "start"

    def start_clients(self, duration_s: float) -> None:
        """Start every client, wait until each is ready (bounded), then start the clock:
        ``t0_ns`` is now, ``until_ns`` the clients' deadline."""
        for slot in range(self.config.clients):
            client = ClientSlot(slot, self.client_mode(slot), tso=self.pinned_tso(slot))
            phase_path = self.work / "clients" / f"slot{slot}.phase"
            client.phase = Phase(phase_path)
            self.clients.append(client)
            self._spawn_client(client)
        started = time.monotonic()
        deadline = started + CLIENT_READY_TIMEOUT_S
        waiting = list(self.clients)
        while waiting and time.monotonic() < deadline:
            waiting = [
                c
                for c in waiting
                if c.proc is not None
                and c.proc.alive
                and c.phase is not None
                and c.phase.get() != Phase.READY
            ]
            time.sleep(0.02)
        if waiting:
            log.warning(
                "client(s) %s not ready after %.0f s: starting without them",
                ",".join(str(c.slot) for c in waiting),
                CLIENT_READY_TIMEOUT_S,
            )
        self.t0_ns = time.monotonic_ns() + 100_000_000
        self.until_ns = self.t0_ns + int(duration_s * 1e9)
        self._write_start_file()
        log.info("%d clients ready in %.1f s", len(self.clients), time.monotonic() - started)
        if self.leader_watch is not None and self.replicas:
            self.leader_watch.start(self.t0_ns)
        if self.replicas:
            self.leader_metrics = LeaderMetricsWatch(
                self.metrics_ports, self.config.leader_lease_ms
            )
            self.leader_metrics.start(self.t0_ns)

    def process_of(self, client: ClientSlot) -> int:
        return client.slot + self.config.clients * client.generation

    def _spawn_client(self, client: ClientSlot) -> None:
        process = self.process_of(client)
        events = self.work / "clients" / f"p{process}.jsonl"
        client.events.append(events)
        command = [
            sys.executable,
            "-m",
            "percolake.tools.chaos.client",
            "--run-config",
            str(self.config.out_dir / "run-config.json"),
            "--process",
            str(process),
            "--mode",
            client.mode,
            "--gateways",
            ",".join(g.address for g in self.gateways),
            "--tso",
            client.tso or self.tso_address,
            "--locks",
            self.locks_address,
            "--store",
            self.store_url,
            "--warehouse",
            self.warehouse,
            "--start-file",
            str(self.start_file),
            "--events",
            str(events),
            "--phase",
            str(self.work / "clients" / f"slot{client.slot}.phase"),
        ]
        client.proc = Managed(
            f"client-{client.slot}",
            command,
            self.work / "clients" / f"slot{client.slot}.log",
            self.registry,
            env={**self._broken_env(), **self._s3_env()},
            gid=self._gid(GID_CLIENT_BASE + client.slot),
        )
        client.proc.spawn()

    def crash_client(self, client: ClientSlot) -> int:
        """SIGKILL the slot's process; returns its process number."""
        assert client.proc is not None
        process = self.process_of(client)
        client.proc.kill()
        self.crashed[process] = time.monotonic_ns() - self.t0_ns
        if client.phase is not None:
            client.phase.set(Phase.IDLE)
        return process

    def extend_until(self, until_ns: int) -> bool:
        """Move the clients' deadline later (never earlier) while they still run.

        Clients read the start file again when they reach their deadline, so the new one
        reaches every client that has not yet stopped; a deadline already passed stays.
        """
        # A margin: a client reading the file right at its deadline must see the new one.
        if until_ns <= self.until_ns or time.monotonic_ns() >= self.until_ns - 200_000_000:
            return False
        self.until_ns = until_ns
        self._write_start_file()
        return True

    def _write_start_file(self) -> None:
        """``T0_NS UNTIL_NS``, replaced at once: a client never reads half of it."""
        partial = self.start_file.with_suffix(".tmp")
        partial.write_text(f"{self.t0_ns} {self.until_ns}\n")
        partial.replace(self.start_file)

    def restart_client(self, client: ClientSlot, *, tso: str | None = None) -> int:
        """Start the slot again as a new process number (only before the deadline).

        ``tso``: the oracle the new process talks to (default: the cluster's, or the
        replica a timestamps client is pinned to).
        """
        if time.monotonic_ns() >= self.until_ns:
            return -1
        client.generation += 1
        client.tso = tso or self.pinned_tso(client.slot)
        self._spawn_client(client)
        return self.process_of(client)

    def client_gid(self, client: ClientSlot) -> int:
        return GID_CLIENT_BASE + client.slot

    # --- ending --------------------------------------------------------------------

    def heal_processes(self) -> list[str]:
        """Resume paused processes and restart dead servers and Cassandra nodes."""
        healed = []
        for name, service in self.services().items():
            if service.paused:
                service.resume()
                healed.append(f"resumed {name}")
            if not service.alive and service is not self.embedded:
                # (A killed embedded oracle stays down: it refuses to start while a
                # replica leads, as an embedded manager does.)
                restart(service)
                healed.append(f"restarted {name}")
        for client in self.clients:
            if client.proc is not None and client.proc.paused:
                client.proc.resume()
                healed.append(f"resumed client-{client.slot}")
        s3 = self.heal_s3()
        if s3 is not None:
            healed.append(s3)
        if self.cassandra is not None:
            import signal

            for status in self.cassandra.status():
                if status.process_alive:
                    self.cassandra.kill_node(status.index, signal.SIGCONT)
                else:
                    self.start_cassandra_node(status.index)
                    healed.append(f"restarted cassandra-{status.index}")
        return healed

    def wait_clients(self, timeout_s: float) -> None:
        """Wait for clients to reach their deadline; SIGKILL the ones that do not."""
        deadline = time.monotonic() + timeout_s
        for client in self.clients:
            assert client.proc is not None
            if client.proc.wait(max(0.0, deadline - time.monotonic())) is None:
                log.warning("client-%d still running after its deadline: killing it", client.slot)
                self.crash_client(client)

    def save_cassandra_problems(self, path: Path) -> int:
        """Summarise the nodes' WARN and ERROR log entries into ``path``.

        One line per distinct entry (level, logger position, message and the first line
        of its exception), with how often and when first it occurred. Returns the number
        of entries.
        """
        if self.cassandra is None:
            return 0
        seen: dict[str, list[Any]] = {}
        for index in self.cassandra_nodes:
            logs = self.cassandra.layout.node_dir(index) / "logs"
            for name in ("system.log.3", "system.log.2", "system.log.1", "system.log"):
                try:
                    lines = (logs / name).read_text(errors="replace").splitlines()
                except OSError:
                    continue
                for i, line in enumerate(lines):
                    found = _LOG_ENTRY.match(line)
                    if found is None or found["source"].startswith("StartupChecks"):
                        continue
                    cause = lines[i + 1].strip() if i + 1 < len(lines) else ""
                    if _LOG_ENTRY.match(cause) or cause.startswith(("INFO", "DEBUG")):
                        cause = ""
                    message = _NUMBERED_THREAD.sub(r"\1-N", found["message"])
                    key = f"node{index} {found['level']} {found['source']} {message} :: {cause}"
                    key = key[:400]
                    when = found["when"]
                    entry = seen.setdefault(key, [0, when])
                    entry[0] += 1
        ordered = sorted(seen.items(), key=lambda kv: -kv[1][0])
        path.write_text("".join(f"{n:6d}x first {when}  {key}\n" for key, (n, when) in ordered))
        return sum(n for n, _ in seen.values())

    def stop(self) -> None:
        """Stop every process: clients, then gateways (whose drain and last collection
        pass may still ask the oracle), then the control plane. Each group at once, so
        their graceful stops overlap instead of adding up."""
        stop_together([client.proc for client in self.clients], timeout_s=5)
        for client in self.clients:
            if client.phase is not None:
                client.phase.close()
                client.phase = None
        if self.leader_watch is not None:
            self.leader_watch.stop()
        if self.leader_metrics is not None:
            self.leader_metrics.stop()
        stop_together([*self.gateways, *self.second_oracles])
        stop_together([self.locks, self.tso, *self.replicas, self.embedded])
        if self.cassandra is not None:
            self.cassandra.stop()
        if self.s3 is not None:
            self.s3.stop()


def restart(service: Service, attempts: int = 5) -> None:
    """Start a killed server on its old port; a port still held a moment is retried."""
    for attempt in range(1, attempts + 1):
        try:
            service.start()
            return
        except RuntimeError as exc:
            if attempt == attempts:
                raise
            log.warning("restart of %s failed (%s); retrying", service.name, exc)
            time.sleep(0.5 * attempt)
