"""Faults on a seeded schedule: kills, pauses, partitions, a slow network, oracle
overlaps, and faults of the leader of a replicated control plane.

:func:`plan` turns the seed and the cluster's shape into a list of faults (when, what,
on which process, for how long) without looking at anything else, so the same seed on
the same shape gives the same schedule: a failing run can be replayed. :class:`Nemesis`
carries the schedule out one fault at a time, heals each one when its time is up, and
records when each fault really began and ended.

An oracle overlap is a restart of the oracle done the careless way: the new oracle is
started while the old one still serves (rule S7). A second ``percolake serve`` on the
store is a replica: it starts, finds the old oracle's leader lease renewed and follows
(it forwards every call to the leader). One client process reconnects to the
newcomer, as a process that connects during the overlap would; when the fault's time
is up the fault records who led throughout (the old oracle, by the store's leader
row), stops the newcomer and moves the client back. In the test-only
``--unsafe-no-oracle-claim`` build oracles take neither claim nor lease: the newcomer
serves by itself, and the two hand out timestamps side by side until the end of the
fault, when both are stopped and the old one restarts above both bounds; the checks
must then find anomalies.

The leader faults (``--replicas N``) find the replica that leads when the fault begins
on the store's leader row (:meth:`Cluster.leader`): ``leader-kill`` kills it (SIGKILL)
and restarts it on its port when the fault's time is up; ``leader-pause`` stops it
(SIGSTOP) for longer than its lease; ``leader-partition`` cuts it off (on SQLite its
port from everyone, while it still reaches the store's file, so the followers depose
it after ``DEPOSE_AFTER_LEASES`` leases; on Cassandra every packet it sends, so its
renewals fail and its lease runs out); ``rolling-restart`` stops every replica in
turn gracefully (SIGTERM: a leader hands its row over), restarts it and waits until a
leader serves again before the next.

The S3 faults (``--warehouse s3``) hit the run's MinIO: ``s3-pause`` stops it (SIGSTOP)
and ``s3-kill`` kills it -9, healed by SIGCONT or by a restart on the same data and
port. Writes of table files then hang or fail, and so does a commit that dates its files
by their objects' mtimes.
"""

from __future__ import annotations

import functools
import logging
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from percolake.tools.chaos import _network as net
from percolake.tools.chaos._cluster import (
    GID_CASSANDRA_BASE,
    GID_GATEWAY_BASE,
    GID_REPLICA_BASE,
    Cluster,
    restart,
)
from percolake.tools.chaos._config import MAX_STRETCH, RunConfig
from percolake.tools.chaos._ops import Phase
from percolake.tools.chaos._procs import Service
from storage_adapters.sqlite import parse_sqlite_url

log = logging.getLogger(__name__)

#: How long a client kill waits for the client to be inside a commit before it
#: kills it anyway: a client that never commits (reads only) must not stall the plan.
MID_COMMIT_WAIT_S: Final = 3.0
#: While an injection or a heal still runs this close to the clients' deadline, the
#: deadline moves ``KEEP_STEP_S`` later (within ``MAX_STRETCH``): a heal that ends past
#: the deadline could no longer move it, and the faults after it were dropped (a kill's
#: restart and takeover took 8 s on a loaded CI machine, from 4.5 s of an 11 s run).
KEEP_MARGIN_S: Final = 0.5
KEEP_STEP_S: Final = 1.0

T = TypeVar("T")
#: How long an overlap of two serving oracles is stretched until the client process
#: that reconnected to the newcomer has completed an operation (a slow start-up on a
#: loaded machine; never past the clients' deadline), and how long it goes on after
#: that, so that other clients begin transactions after that operation completed while
#: both oracles still serve.
OVERLAP_PROGRESS_WAIT_S: Final = 20.0
OVERLAP_AFTER_PROGRESS_S: Final = 1.0
#: The slow network: bandwidth of the token bucket on loopback and TCP packet loss.
SLOW_RATE_MBIT: Final = 20
SLOW_LOSS: Final = 0.03
#: How long a leader fault waits for a replica to lead (an election under way), in leases
#: on top of a few seconds (a loaded machine).
LEADER_WAIT_LEASES: Final = 4
LEADER_WAIT_S: Final = 10.0
#: A leader pause on SQLite stops waiting for a takeover once the store's write lock has
#: been held this many leases without a break (the paused leader holds it: no one can).
WRITE_LOCKED_LEASES: Final = 3.0
#: How long, in leases, a leader-pause fault that ended on SQLite's write lock waits
#: after the resume for a takeover, which may not come (``_leader_fault``).
AFTER_WRITE_LOCK_LEASES: Final = 2.0
#: How long an ``s3-pause`` stops MinIO.
S3_PAUSE_MIN_S: Final = 1.0
S3_PAUSE_MAX_S: Final = 4.0


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
    gateways = [f"gateway-{i}" for i in range(config.gateways if config.uses_transactions else 0)]
    clients = [f"client-{k}" for k in range(config.clients)]
    nodes = (
        [f"cassandra-{n}" for n in range(1, config.cassandra_nodes + 1)] if owns_cassandra else []
    )
    direct = [
        f"client-{k}" for k in range(config.clients) if config.workload == "lakehouse" or k % 2 == 1
    ]
    nodes_apart = [
        nodes if len(nodes) > 1 else [],
        [f"{n}~clients" for n in nodes],
    ]
    if config.replicas:
        replicas = [f"replica-{i}" for i in range(config.replicas)]
        processes = [replicas, gateways, clients, nodes]
        partitions = [replicas, gateways, [f"{c}~all" for c in clients], *nodes_apart]
    else:
        processes = [["tso"], ["locks"], gateways, clients, nodes]
        partitions = [
            ["tso"],
            ["locks"],
            gateways,
            [f"{g}~locks" for g in gateways] + [f"{c}~locks" for c in direct],
            [f"{g}~tso" for g in gateways],
            [f"{c}~all" for c in clients],
            *nodes_apart,
        ]
    offered = {
        "kill": processes,
        "pause": processes,
        "partition": partitions,
        "slow": [["network"]],
        "oracle-overlap": [["tso"]],
        "leader-kill": [["leader"]],
        "leader-pause": [["leader"]],
        "leader-partition": [["leader"]],
        "rolling-restart": [["replicas"]],
        "s3-pause": [["s3"]] if config.warehouse == "s3" else [],
        "s3-kill": [["s3"]] if config.warehouse == "s3" else [],
    }
    return {kind: [g for g in offered[kind] if g] for kind in config.nemeses}


def _duration(rng: random.Random, config: RunConfig, kind: str, target: str) -> float:
    lease_s = config.lease_ms / 1000
    leader_s = config.leader_lease_ms / 1000
    if kind == "leader-kill":
        return rng.uniform(0.5, 3.0)  # down this long, then restarted as a follower
    if kind == "leader-pause":
        # Past its lease: another replica takes over (after 1.1 leases) and serves a
        # while before the paused one wakes.
        return rng.uniform(2.5, 4.0) * leader_s
    if kind == "leader-partition":
        # SQLite: clients move off it (two missed probes, ~2-3 s), the followers they
        # move to cannot forward to it, depose it after 3 leases and take over 1.1
        # leases later. Cassandra: its lease runs out after one.
        return rng.uniform(8.0, 11.0) * leader_s + 3.0
    if kind == "rolling-restart":
        # Each replica: a graceful stop, a start, a leader serving again.
        return config.replicas * (3.0 + leader_s)
    if kind == "s3-pause":
        # Requests hang meanwhile; well inside the client's 30 s request timeout, so
        # most complete after the wake-up, as on a stalled host.
        return rng.uniform(S3_PAUSE_MIN_S, S3_PAUSE_MAX_S)
    if kind == "s3-kill":
        return rng.uniform(0.5, 3.0)  # down this long (requests refused), then restarted
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
        #: How far the rest of the plan has shifted (``_stretch``), in nanoseconds: the
        #: deadline is kept in integers, so a bound reached is the bound exactly (in
        #: floats, each stretch fell a nanosecond short of it, and a test of the bound
        #: saw 0.999999998 s for 1 s).
        self._late_ns = 0

    @property
    def _late_s(self) -> float:
        return self._late_ns / 1e9

    def _now_s(self) -> float:
        return (time.monotonic_ns() - self.cluster.t0_ns) / 1e9

    def _end_s(self) -> float:
        return (self.cluster.until_ns - self.cluster.t0_ns) / 1e9

    def _stretch(self, late_s: float) -> None:
        """Shift what is left of the plan ``late_s`` later and the clients' deadline with
        it, within :data:`MAX_STRETCH` of the planned duration."""
        planned_ns = self.cluster.until_ns - self.cluster.t0_ns - self._late_ns
        late_ns = min(round(late_s * 1e9), round(MAX_STRETCH * planned_ns))
        if late_ns > self._late_ns and self.cluster.extend_until(
            self.cluster.t0_ns + planned_ns + late_ns
        ):
            self._late_ns = late_ns

    def _keeping_the_deadline(self, action: Callable[[], T]) -> T:
        """``action()``, with the deadline moved ``KEEP_STEP_S`` later each time it comes
        within ``KEEP_MARGIN_S`` while the action still runs (within ``MAX_STRETCH``);
        :meth:`_stretch` afterwards sets how late the plan really runs."""
        done = threading.Event()

        def keep() -> None:
            while not done.wait(max(0.0, self._end_s() - self._now_s() - KEEP_MARGIN_S)):
                before = self._late_s
                self._stretch(before + KEEP_STEP_S)
                if self._late_s == before:
                    return  # at the bound, or the deadline already passed
                log.info("a fault step still runs near the deadline: %.1f s later", KEEP_STEP_S)

        keeper = threading.Thread(target=keep, name="keep-deadline", daemon=True)
        keeper.start()
        try:
            return action()
        finally:
            done.set()
            keeper.join()

    def run(self, schedule: list[PlannedFault], stop: threading.Event) -> None:
        """Carry out ``schedule``. A fault that starts or heals late shifts the faults
        after it and the end of the run as late (within :data:`MAX_STRETCH`), so a
        loaded machine keeps each planned fault and the quiet time after the last."""
        for fault in schedule:
            at_s = fault.at_s + self._late_s
            if stop.wait(max(0.0, at_s - self._now_s())) or self._now_s() >= self._end_s():
                return
            record: dict[str, Any] = {**asdict(fault), "start_s": round(self._now_s(), 3)}
            name = f"{fault.kind} {fault.target}"
            try:
                heal, detail = self._keeping_the_deadline(functools.partial(self._inject, fault))
            except Exception as exc:
                log.error("could not inject %s: %s", name, exc)
                record.update(end_s=record["start_s"], error=str(exc))
                self.faults.append(record)
                continue
            record.update(detail)
            with self._lock:
                self.current = name
            log.info("fault: %s for %.1f s %s", name, fault.duration_s, detail or "")
            # Injecting took time (a server or client process started on a loaded machine).
            self._stretch(self._now_s() - fault.at_s)
            heal_at_s = fault.at_s + self._late_s + fault.duration_s
            stop.wait(max(0.0, min(heal_at_s, self._end_s()) - self._now_s()))
            try:
                healed = self._keeping_the_deadline(heal)
                if healed:
                    record["healed"] = healed
            except Exception as exc:
                log.error("could not heal %s: %s", name, exc)
                record["heal_error"] = str(exc)
            record["end_s"] = round(self._now_s(), 3)
            # Healing took time (a takeover awaited, a restart on a loaded machine).
            self._stretch(self._now_s() - fault.at_s - fault.duration_s)
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
        if kind.startswith("leader-"):
            return self._leader_fault(kind)
        if kind == "rolling-restart":
            return self._rolling_restart()
        if kind.startswith("s3-"):
            return self._s3(kind)
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
        before = self._leader_row()
        newcomer = cluster.second_oracle()
        newcomer.start()  # a replica now: it does not exit (it used to, on a file lock)
        # Leading replicas name themselves in the row; plain oracles (the unsafe build)
        # write none and each serves alone.
        row = self._leader_row()
        if row is None:
            role = "serving"
        else:
            role = "leader" if row.get("address") == newcomer.address else "follower"
        detail: dict[str, Any] = {
            "newcomer": role,
            "address": newcomer.address,
            "leader_before": before,
        }
        # A process that connects now reaches the newcomer.
        direct = [c for c in cluster.clients if c.mode == "direct" and c.proc and c.proc.alive]
        moved = direct[0] if direct else None
        if moved is not None:
            detail["crashed"] = cluster.crash_client(moved)
            detail["reconnected"] = cluster.restart_client(moved, tso=newcomer.address)

        def move_back() -> None:
            if moved is not None and moved.tso is not None:
                cluster.crash_client(moved)
                cluster.restart_client(moved)

        def end_overlap() -> dict[str, Any]:
            # Only a client that reconnected can progress, and only until the clients'
            # deadline: a restart refused past it (process -1) left the crashed
            # process's events last, and waiting on them cost the run its full wait.
            left_s = (cluster.until_ns - time.monotonic_ns()) / 1e9
            progressed = (
                moved is not None
                and detail.get("reconnected", -1) >= 0
                and _wait_for_a_completion(
                    moved.events[-1], min(OVERLAP_PROGRESS_WAIT_S, max(0.0, left_s))
                )
            )
            if progressed:
                time.sleep(OVERLAP_AFTER_PROGRESS_S)
            row_after = self._leader_row()
            newcomer_led = "leads tso" in newcomer.tail(1_000_000)
            if role != "serving":
                # The newcomer followed: it goes, the leader stays.
                newcomer.stop()
                move_back()
                return {
                    "leader_after": row_after,
                    "newcomer_led": newcomer_led,
                    "moved_client_progressed": progressed,
                    "stopped": "the newcomer; the old oracle kept leading",
                }
            old.kill()
            newcomer.kill()
            restart(old)  # above both oracles' bounds
            move_back()
            return {
                "moved_client_progressed": progressed,
                "stopped": f"both oracles; one restarted on {old.address}",
            }

        return end_overlap, detail

    def _leader_row(self) -> dict[str, Any] | None:
        """The leader row now, for a fault's record (``None``: no one ever led)."""
        watch = self.cluster.leader_watch
        record = None if watch is None else watch.read()
        if record is None:
            return None
        names = self.cluster.replica_names()
        oracle = self.cluster.tso
        if oracle is not None and oracle.port:
            names.setdefault(oracle.address, oracle.name)
        return {
            "epoch": record.epoch,
            "address": record.address,
            "name": names.get(record.address, record.address),
            "live": record.live,
        }

    # --- faults of a replicated control plane --------------------------------------

    def _find_leader(self) -> Service:
        lease_s = self.cluster.config.leader_lease_ms / 1000
        replica, _ = self.cluster.leader(LEADER_WAIT_S + LEADER_WAIT_LEASES * lease_s)
        return replica

    def _leader_fault(self, kind: str) -> tuple[Callable[[], Any], dict[str, Any]]:
        replica = self._find_leader()
        detail: dict[str, Any] = {"replica": replica.name, "leader_before": self._leader_row()}
        if kind == "leader-kill":
            replica.kill()

            def restart_it() -> dict[str, Any]:
                if replica is self.cluster.embedded:
                    return self._restart_embedded(replica)
                restart(replica)
                return {"restarted": replica.name, "leader_after": self._leader_row()}

            return restart_it, detail
        if kind == "leader-pause":
            replica.pause()

            def resume_it() -> dict[str, Any]:
                # Past its lease means until another replica leads: on a loaded machine
                # the followers may take longer than the planned pause to claim the
                # lease, and waking the leader first would test nothing (bounded).
                waited, write_locked = self._await_new_epoch(detail["leader_before"])
                replica.resume()
                if write_locked:
                    # Paused inside a write transaction on SQLite: nobody could take
                    # over while it held the file. Once awake it may let go (ci43: a
                    # takeover 0.3 s after the resume) or renew and lead on, safely,
                    # as nobody else led meanwhile (a session-17 run: epoch 2 still
                    # 14 s later). A short wait lets the record show a takeover that
                    # comes, without holding the faults planned after it.
                    lease_s = self.cluster.config.leader_lease_ms / 1000
                    after_s, _ = self._await_new_epoch(
                        detail["leader_before"], bound_s=AFTER_WRITE_LOCK_LEASES * lease_s
                    )
                    waited += after_s
                healed: dict[str, Any] = {
                    "resumed": replica.name,
                    "leader_after": self._leader_row(),
                    "waited_for_takeover_s": round(waited, 2),
                }
                if write_locked:
                    healed["store_write_locked"] = True
                return healed

            return resume_it, detail
        network = self._network()
        port = replica.port
        assert port is not None
        rules = list(net.port_rules(port))
        if self.cluster.cassandra is not None or not self.cluster.config.sqlite_oracle:
            # Cut off from the store too: every packet it sends.
            index = int(replica.name.removeprefix("replica-"))
            rules += net.gid_rules(GID_REPLICA_BASE + index)
        added = network.drop(rules)
        detail["rules"] = len(added)

        def heal() -> dict[str, Any]:
            network.undrop(added)
            return {"healed": replica.name, "leader_after": self._leader_row()}

        return heal, detail

    def _await_new_epoch(
        self, before: dict[str, Any] | None, *, bound_s: float | None = None
    ) -> tuple[float, bool]:
        """Wait (bounded) until the leader row shows an epoch above ``before``'s; returns
        the seconds waited (a timeout leaves the fault's record to show no takeover) and
        whether the wait ended early on a SQLite store whose write lock stayed held.

        On SQLite a leader paused inside a write transaction keeps the file's write
        lock, and nobody can take over until it resumes (docs/design/limits.md): once
        the lock has been held for ``WRITE_LOCKED_LEASES`` leases without a break, the
        wait ends instead of running out its bound, which cost the rest of a short
        run its faults."""
        lease_s = self.cluster.config.leader_lease_ms / 1000
        started = time.monotonic()
        deadline = started + (
            bound_s if bound_s is not None else LEADER_WAIT_S + LEADER_WAIT_LEASES * lease_s
        )
        sqlite_path = _sqlite_path(self.cluster.tso_store_url)
        locked_since: float | None = None
        while before is not None and time.monotonic() < deadline:
            row = self._leader_row()
            if row is not None and row["epoch"] > before["epoch"]:
                break
            if sqlite_path is not None:
                now = time.monotonic()
                if not _write_locked(sqlite_path):
                    locked_since = None
                elif locked_since is None:
                    locked_since = now
                elif now - locked_since >= WRITE_LOCKED_LEASES * lease_s:
                    return now - started, True
            time.sleep(0.05)
        return time.monotonic() - started, False

    def _restart_embedded(self, embedded: Service) -> dict[str, Any]:
        """Start the killed embedded oracle again. As an embedded manager, it refuses
        (exit 3) while a replica leads or holds the store's claim, which is the usual
        outcome: the fault records it, and the embedded oracle stays down."""
        try:
            embedded.start()
        except RuntimeError as exc:
            log.info("the embedded oracle did not start again: %s", str(exc)[-200:])
            return {"restart_refused": embedded.name, "leader_after": self._leader_row()}
        return {"restarted": embedded.name, "leader_after": self._leader_row()}

    def _rolling_restart(self) -> tuple[Callable[[], Any], dict[str, Any]]:
        """Every replica in turn: SIGTERM, start again on its port, wait for a leader."""
        cluster = self.cluster
        lease_s = cluster.config.leader_lease_ms / 1000
        steps: list[dict[str, Any]] = []
        for replica in list(cluster.replicas):
            started = time.monotonic()
            code = replica.stop()
            restart(replica)
            leader, _ = cluster.leader(LEADER_WAIT_S + LEADER_WAIT_LEASES * lease_s)
            steps.append(
                {
                    "replica": replica.name,
                    "exit_code": code,
                    "leader": leader.name,
                    "took_s": round(time.monotonic() - started, 2),
                }
            )
        return (lambda: None), {"steps": steps, "leader_after": self._leader_row()}

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

    def _s3(self, kind: str) -> tuple[Callable[[], Any], dict[str, Any]]:
        """Pause (SIGSTOP; healed by SIGCONT) or kill -9 (healed by a restart on the same
        data and port) the run's MinIO."""
        s3 = self.cluster.s3
        if s3 is None:
            raise RuntimeError(f"{kind} needs the run's S3 server (--warehouse s3)")
        if kind == "s3-kill":
            s3.kill()
            return s3.start, {}
        s3.pause()
        return s3.resume, {}

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


def _sqlite_path(store_url: str) -> str | None:
    """The database file of a ``sqlite:///`` store URL (``None`` for other stores)."""
    if not store_url.startswith("sqlite:"):
        return None
    return parse_sqlite_url(store_url).path


def _write_locked(path: str) -> bool:
    """Whether another connection holds the SQLite file's write lock now (a write
    transaction under way): ``BEGIN IMMEDIATE`` without waiting, rolled back at once."""
    try:
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc) or "busy" in str(exc)
    finally:
        conn.close()


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
