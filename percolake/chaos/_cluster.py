"""The cluster of a chaos run: store, oracle, lock server, gateways and clients.

Each is a real process on loopback. Restarted servers come back on their old port,
so clients and gateways reconnect on their own. Clients are numbered Jepsen-style: a
client slot whose process was killed comes back as a new process number
(``slot + clients * generation``), so the killed process's last operation stays open
in the history and is recorded as unknown.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from percolake.chaos._config import BROKEN_PROTOCOL_ENV, NO_ORACLE_CLAIM_ENV, RunConfig
from percolake.chaos._ops import Phase
from percolake.chaos._procs import Managed, PidRegistry, Service
from txn import TransactionManager

log = logging.getLogger(__name__)

#: Group ids that tell the processes of a run apart in ``iptables -m owner`` rules.
GID_TSO: Final = 60_001
GID_LOCKS: Final = 60_002
GID_GATEWAY_BASE: Final = 61_000
GID_CLIENT_BASE: Final = 62_000
GID_CASSANDRA_BASE: Final = 63_000

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
    #: The oracle this slot's process talks to, when not the cluster's (oracle overlap).
    tso: str | None = None
    proc: Managed | None = None
    phase: Phase | None = None
    events: list[Path] = field(default_factory=list)


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in ports:
            ports.append(port)
    return ports


class Cluster:
    def __init__(
        self, config: RunConfig, work_dir: Path, registry: PidRegistry, *, isolated: bool
    ) -> None:
        self.config = config
        self.work = work_dir
        self.registry = registry
        #: In the run's own namespace: fixed ports are free and group ids tag processes.
        self.isolated = isolated
        self.cassandra: Any = None  # percolake.cassandra.CassandraCluster
        self.store_url = ""
        self.tso_store_url = ""
        self.warehouse = str(work_dir / "warehouse")
        self.tso: Service | None = None
        self.locks: Service | None = None
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
            from percolake.cassandra import CassandraCluster

            ports = [9042, 7000, 7199] if self.isolated else _free_ports(3)
            self.cassandra = CassandraCluster(
                nodes=c.cassandra_nodes,
                base_dir=self.work / "cassandra",
                cluster_name="percolake-chaos",
                native_transport_port=ports[0],
                storage_port=ports[1],
                jmx_port=ports[2],
                heap_mb=c.cassandra_heap_mb,
                extra_yaml=CASSANDRA_YAML,
            )
            log.info("starting %d Cassandra node(s)", c.cassandra_nodes)
            if self.isolated:
                # One by one, each under its own group id (see start_cassandra_node);
                # start() then records the layout and waits until the ring has formed.
                for index in range(1, c.cassandra_nodes + 1):
                    self.start_cassandra_node(index)
            self.cassandra.start()
            rf = min(3, c.cassandra_nodes)
            self.store_url = self.cassandra.store_url(KEYSPACE, replication_factor=rf)
            self.tso_store_url = self.store_url
        elif c.store_url is not None and c.store_url.startswith("cassandra://"):
            self.store_url = self.tso_store_url = c.store_url
        else:
            self.store_url = c.store_url or f"sqlite:///{self.work / 'data.db'}"
            self.tso_store_url = f"sqlite:///{self.work / 'tso.db'}"
        from storage_adapters import open_store

        open_store(self.store_url).close()  # creates the keyspace once, before anyone races

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
        return {BROKEN_PROTOCOL_ENV: "1" if self.config.unsafe_broken_protocol else ""}

    def _oracle(self, name: str) -> Service:
        return Service(
            name,
            "percolake.chaos.serve tso",
            ["--store", self.tso_store_url],
            self.work,
            self.registry,
            env={NO_ORACLE_CLAIM_ENV: "1" if self.config.unsafe_no_oracle_claim else ""},
            gid=self._gid(GID_TSO),
        )

    def second_oracle(self) -> Service:
        """A second oracle on the oracle's store, not started yet (on a port of its own)."""
        oracle = self._oracle(f"tso-overlap-{len(self.second_oracles)}")
        self.second_oracles.append(oracle)
        return oracle

    def start_services(self) -> None:
        c = self.config
        self.tso = self._oracle("tso").start()
        self.locks = Service(
            "locks", "percolake serve locks", [], self.work, self.registry, gid=self._gid(GID_LOCKS)
        ).start()
        for i in range(c.gateways):
            gateway = Service(
                f"gateway-{i}",
                "percolake.chaos.serve txn",
                [
                    "--store",
                    self.store_url,
                    "--tso",
                    self.tso.address,
                    "--locks",
                    self.locks.address,
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
                ],
                self.work,
                self.registry,
                env=self._broken_env(),
                gid=self._gid(GID_GATEWAY_BASE + i),
            )
            self.gateways.append(gateway.start())
        log.info(
            "oracle %s, lock server %s, gateways %s",
            self.tso.address,
            self.locks.address,
            ",".join(g.address for g in self.gateways),
        )

    def services(self) -> dict[str, Service]:
        assert self.tso is not None and self.locks is not None
        named = {"tso": self.tso, "locks": self.locks}
        named.update({g.name: g for g in self.gateways})
        return named

    def direct_manager(self) -> TransactionManager:
        from percolake.chaos.client import direct_manager

        assert self.tso is not None and self.locks is not None
        return direct_manager(
            self.store_url,
            self.tso.address,
            self.locks.address,
            self.config,
            timeout_s=self.config.client_timeout_s,
        )

    # --- clients -------------------------------------------------------------------

    def client_mode(self, slot: int) -> str:
        # Half the clients go through the gateways (the deployed topology: every
        # workload, lakehouse included, since Lakehouse takes any txn.Manager), half
        # run the protocol in their own process.
        return "remote" if slot % 2 == 0 else "direct"

    def start_clients(self, t0_ns: int, until_ns: int) -> None:
        self.t0_ns, self.until_ns = t0_ns, until_ns
        for slot in range(self.config.clients):
            client = ClientSlot(slot, self.client_mode(slot))
            phase_path = self.work / "clients" / f"slot{slot}.phase"
            client.phase = Phase(phase_path)
            self.clients.append(client)
            self._spawn_client(client)

    def process_of(self, client: ClientSlot) -> int:
        return client.slot + self.config.clients * client.generation

    def _spawn_client(self, client: ClientSlot) -> None:
        assert self.tso is not None and self.locks is not None
        process = self.process_of(client)
        events = self.work / "clients" / f"p{process}.jsonl"
        client.events.append(events)
        command = [
            sys.executable,
            "-m",
            "percolake.chaos.client",
            "--run-config",
            str(self.config.out_dir / "run-config.json"),
            "--process",
            str(process),
            "--mode",
            client.mode,
            "--gateways",
            ",".join(g.address for g in self.gateways),
            "--tso",
            client.tso or self.tso.address,
            "--locks",
            self.locks.address,
            "--store",
            self.store_url,
            "--warehouse",
            self.warehouse,
            "--t0-ns",
            str(self.t0_ns),
            "--until-ns",
            str(self.until_ns),
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
            env=self._broken_env(),
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

    def restart_client(self, client: ClientSlot, *, tso: str | None = None) -> int:
        """Start the slot again as a new process number (only before the deadline).

        ``tso``: the oracle the new process talks to (default: the cluster's).
        """
        if time.monotonic_ns() >= self.until_ns:
            return -1
        client.generation += 1
        client.tso = tso
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
            if not service.alive:
                restart(service)
                healed.append(f"restarted {name}")
        for client in self.clients:
            if client.proc is not None and client.proc.paused:
                client.proc.resume()
                healed.append(f"resumed client-{client.slot}")
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
        for client in self.clients:
            if client.proc is not None:
                client.proc.stop(timeout_s=5)
            if client.phase is not None:
                client.phase.close()
                client.phase = None
        for service in [*self.gateways, self.locks, self.tso, *self.second_oracles]:
            if service is not None:
                service.stop()
        if self.cassandra is not None:
            self.cassandra.stop()


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
