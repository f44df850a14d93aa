"""Faults on a seeded schedule: kills, pauses, partitions, a slow network, oracle overlaps.

:func:`plan` turns the seed and the cluster's shape into a list of faults (when, what,
on which process, for how long) without looking at anything else, so the same seed on
the same shape gives the same schedule: a failing run can be replayed. :class:`Nemesis`
carries the schedule out one fault at a time, heals each one when its time is up, and
records when each fault really began and ended.

An oracle overlap is a restart of the oracle done the careless way: the new oracle is
started while the old one still serves (rule S7). On SQLite the newcomer must refuse
at once on the store's file lock; the fault records that refusal, then stops the old
oracle (SIGKILL) and, when the fault's time is up, starts the new one, which takes
over. If the newcomer serves instead (the test-only ``--unsafe-no-oracle-claim``
build), one client process reconnects to it, as a process that connects during the
overlap would, and the two oracles hand out timestamps side by side until the end of
the fault: the checks must then find anomalies.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from percolake.chaos import _network as net
from percolake.chaos._cluster import GID_CASSANDRA_BASE, GID_GATEWAY_BASE, Cluster, restart
from percolake.chaos._config import RunConfig
from percolake.chaos._ops import Phase

log = logging.getLogger(__name__)

#: How long a client kill waits for the client to be inside a commit before it
#: kills it anyway: a client that never commits (reads only) must not stall the plan.
MID_COMMIT_WAIT_S: Final = 3.0
#: How long an overlap of two serving oracles is stretched until the client process
#: that reconnected to the newcomer has completed an operation (a slow start-up).
OVERLAP_PROGRESS_WAIT_S: Final = 10.0
#: The slow network: bandwidth of the token bucket on loopback and TCP packet loss.
SLOW_RATE_MBIT: Final = 20
SLOW_LOSS: Final = 0.03


@dataclass(frozen=True, slots=True)
class PlannedFault:
    at_s: float
    kind: str
    target: str
    duration_s: float


def fault_targets(config: RunConfig, *, owns_cassandra: bool) -> dict[str, list[list[str]]]:
    """The targets of every fault family a run of this shape offers, in groups.

    A fault picks a group first and then a member, so that six clients do not make
    a client six times likelier to be hit than the oracle.
    """
    gateways = [f"gateway-{i}" for i in range(config.gateways)]
    clients = [f"client-{k}" for k in range(config.clients)]
    nodes = (
        [f"cassandra-{n}" for n in range(1, config.cassandra_nodes + 1)] if owns_cassandra else []
    )
    direct = [
        f"client-{k}" for k in range(config.clients) if config.workload == "lakehouse" or k % 2 == 1
    ]
    processes = [["tso"], ["locks"], gateways, clients, nodes]
    partitions = [
        ["tso"],
        ["locks"],
        gateways,
        [f"{g}~locks" for g in gateways] + [f"{c}~locks" for c in direct],
        [f"{g}~tso" for g in gateways],
        [f"{c}~all" for c in clients],
        nodes if len(nodes) > 1 else [],
        [f"{n}~clients" for n in nodes],
    ]
    offered = {
        "kill": processes,
        "pause": processes,
        "partition": partitions,
        "slow": [["network"]],
        "oracle-overlap": [["tso"]],
    }
    return {kind: [g for g in offered[kind] if g] for kind in config.nemeses}


def _duration(rng: random.Random, config: RunConfig, kind: str, target: str) -> float:
    lease_s = config.lease_ms / 1000
    if kind == "kill":
        return rng.uniform(3.0, 10.0) if target.startswith("cassandra") else rng.uniform(0.2, 2.0)
    if kind == "pause":
        if target.startswith(("gateway", "client")):
            return rng.uniform(1.5, 3.0) * lease_s  # outlive the leases the process holds
        if target.startswith("cassandra"):
            return rng.uniform(2.0, 8.0)
        return rng.uniform(0.5, 3.0)
    if kind == "partition":
        return rng.uniform(2.0, 8.0)
    if kind == "oracle-overlap":
        return rng.uniform(1.0, 3.0)
    return rng.uniform(3.0, 8.0)


def plan(config: RunConfig, *, owns_cassandra: bool) -> list[PlannedFault]:
    """The schedule of a run: a function of the seed and the run's shape only."""
    targets = fault_targets(config, owns_cassandra=owns_cassandra)
    kinds = [k for k in config.nemeses if targets.get(k)]
    if not kinds:
        return []
    rng = random.Random(f"{config.seed}-nemesis")
    # Quiet at both ends: a baseline first, and time for stragglers to finish last.
    quiet_end_s = min(5.0, 0.15 * config.duration_s)
    end_s = config.duration_s - quiet_end_s
    t = min(1.0, 0.1 * config.duration_s)
    faults: list[PlannedFault] = []
    while True:
        kind = rng.choice(kinds)
        target = rng.choice(rng.choice(targets[kind]))
        duration = _duration(rng, config, kind, target)
        if t + 0.2 > end_s:
            break
        faults.append(PlannedFault(round(t, 3), kind, target, round(min(duration, end_s - t), 3)))
        t += duration + rng.uniform(0.5, 1.5) * config.fault_gap_s
    return faults


class Nemesis:
    """Carries out a schedule against a running cluster, one fault at a time."""

    def __init__(self, cluster: Cluster, network: net.Network | None) -> None:
        self.cluster = cluster
        self.network = network
        self.faults: list[dict[str, Any]] = []
        self.current: str | None = None
        self._lock = threading.Lock()

    def _now_s(self) -> float:
        return (time.monotonic_ns() - self.cluster.t0_ns) / 1e9

    def run(self, schedule: list[PlannedFault], stop: threading.Event) -> None:
        end_s = (self.cluster.until_ns - self.cluster.t0_ns) / 1e9
        for fault in schedule:
            if stop.wait(max(0.0, fault.at_s - self._now_s())) or self._now_s() >= end_s:
                return
            record: dict[str, Any] = {**asdict(fault), "start_s": round(self._now_s(), 3)}
            name = f"{fault.kind} {fault.target}"
            try:
                heal, detail = self._inject(fault)
            except Exception as exc:
                log.error("could not inject %s: %s", name, exc)
                record.update(end_s=record["start_s"], error=str(exc))
                self.faults.append(record)
                continue
            record.update(detail)
            with self._lock:
                self.current = name
            log.info("fault: %s for %.1f s %s", name, fault.duration_s, detail or "")
            stop.wait(max(0.0, min(record["start_s"] + fault.duration_s, end_s) - self._now_s()))
            try:
                healed = heal()
                if healed:
                    record["healed"] = healed
            except Exception as exc:
                log.error("could not heal %s: %s", name, exc)
                record["heal_error"] = str(exc)
            record["end_s"] = round(self._now_s(), 3)
            with self._lock:
                self.current = None
            self.faults.append(record)

    # --- one fault -----------------------------------------------------------------

    def _inject(self, fault: PlannedFault) -> tuple[Callable[[], Any], dict[str, Any]]:
        kind, target = fault.kind, fault.target
        if kind == "slow":
            network = self._network()
            network.slow(SLOW_RATE_MBIT, SLOW_LOSS)
            return network.unslow, {"rate_mbit": SLOW_RATE_MBIT, "loss": SLOW_LOSS}
        if kind == "partition":
            network = self._network()
            rules = network.drop(self._partition_rules(target))
            return (lambda: network.undrop(rules)), {"rules": len(rules)}
        if kind == "oracle-overlap":
            return self._oracle_overlap()
        if target.startswith("cassandra-"):
            return self._cassandra(kind, int(target.removeprefix("cassandra-")))
        if target.startswith("client-"):
            return self._client(kind, int(target.removeprefix("client-")))
        service = self.cluster.services()[target]
        if kind == "kill":
            service.kill()
            return (lambda: restart(service)), {}
        service.pause()
        return service.resume, {}

    def _oracle_overlap(self) -> tuple[Callable[[], Any], dict[str, Any]]:
        cluster = self.cluster
        old = cluster.services()["tso"]
        newcomer = cluster.second_oracle()
        try:
            newcomer.start()
        except RuntimeError:
            exit_code = newcomer.stop()  # exited already: reaps it and forgets its pid
            refusal = [
                line for line in newcomer.tail().splitlines() if "another timestamp oracle" in line
            ]
            # The restart done right: the old oracle goes first, then the new one starts.
            old.kill()

            def take_over() -> str:
                restart(old)
                return f"new oracle took over on {old.address}"

            return take_over, {
                "newcomer": "refused",
                "exit_code": exit_code,
                "refusal": refusal[-1][-300:] if refusal else newcomer.tail(300),
            }
        # Both serve. A process that connects now reaches the newcomer.
        direct = [c for c in cluster.clients if c.mode == "direct" and c.proc and c.proc.alive]
        moved = direct[0] if direct else None
        detail: dict[str, Any] = {"newcomer": "serving", "address": newcomer.address}
        if moved is not None:
            detail["crashed"] = cluster.crash_client(moved)
            detail["reconnected"] = cluster.restart_client(moved, tso=newcomer.address)

        def end_overlap() -> str:
            if moved is not None:
                _wait_for_a_completion(moved.events[-1], OVERLAP_PROGRESS_WAIT_S)
            old.kill()
            newcomer.kill()
            restart(old)  # above both oracles' bounds
            if moved is not None and moved.tso is not None:
                cluster.crash_client(moved)
                cluster.restart_client(moved)
            return f"both oracles stopped; one restarted on {old.address}"

        return end_overlap, detail

    def _network(self) -> net.Network:
        if self.network is None:
            raise net.NetworkError("network faults need the run's own network namespace")
        return self.network

    def _client(self, kind: str, slot: int) -> tuple[Callable[[], Any], dict[str, Any]]:
        client = self.cluster.clients[slot]
        proc = client.proc
        assert proc is not None
        if not proc.alive:
            raise RuntimeError(f"client-{slot} is not running")
        if kind == "pause":
            proc.pause()
            return proc.resume, {"process": self.cluster.process_of(client)}
        in_commit = self._wait_mid_commit(client.phase)
        process = self.cluster.crash_client(client)

        def heal() -> str:
            return f"restarted as process {self.cluster.restart_client(client)}"

        return heal, {"process": process, "in_commit": in_commit}

    @staticmethod
    def _wait_mid_commit(phase: Phase | None) -> bool:
        if phase is None:
            return False
        deadline = time.monotonic() + MID_COMMIT_WAIT_S
        while time.monotonic() < deadline:
            if phase.get() == Phase.COMMITTING:
                return True
            time.sleep(0.0005)
        return False

    def _cassandra(self, kind: str, index: int) -> tuple[Callable[[], Any], dict[str, Any]]:
        cassandra = self.cluster.cassandra
        assert cassandra is not None
        if kind == "kill":
            cassandra.kill_node(index, signal.SIGKILL)
            return (lambda: self.cluster.start_cassandra_node(index)), {}
        cassandra.kill_node(index, signal.SIGSTOP)
        return (lambda: cassandra.kill_node(index, signal.SIGCONT)), {}

    def _partition_rules(self, target: str) -> list[net.Rule]:
        cluster = self.cluster
        services = cluster.services()
        name, _, peer = target.partition("~")
        if name.startswith("cassandra-"):
            assert cluster.cassandra is not None
            index = int(name.removeprefix("cassandra-"))
            address = cluster.cassandra_address(index)
            if peer == "clients":
                return net.address_port_rules(address, cluster.cassandra.port)
            # Its own outbound connections to any peer, and every peer's to it.
            storage_port = cluster.cassandra.layout.storage_port
            return [
                *net.gid_to_port_rules(GID_CASSANDRA_BASE + index, storage_port),
                *net.address_port_rules(address, storage_port),
            ]
        if not peer:
            port = services[name].port
            assert port is not None
            return net.port_rules(port)
        if name.startswith("gateway-"):
            gid = GID_GATEWAY_BASE + int(name.removeprefix("gateway-"))
        else:
            gid = cluster.client_gid(cluster.clients[int(name.removeprefix("client-"))])
        if peer == "all":
            return net.gid_rules(gid)
        port = services[peer].port
        assert port is not None
        return net.gid_to_port_rules(gid, port)


def _wait_for_a_completion(events: Path, timeout_s: float) -> bool:
    """Wait until a client's event file records a completed operation."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if '"type":"ok"' in events.read_text(errors="replace"):
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False
