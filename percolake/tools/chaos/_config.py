"""What one chaos run is: workload, faults, cluster shape, bounds. Units in the names."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

WorkloadName: TypeAlias = Literal["list-append", "bank", "lakehouse", "timestamps"]
IsolationName: TypeAlias = Literal["snapshot", "serializable"]

WORKLOADS: Final[tuple[WorkloadName, ...]] = ("list-append", "bank", "lakehouse", "timestamps")
ISOLATIONS: Final[tuple[IsolationName, ...]] = ("snapshot", "serializable")
#: Fault families ``--nemesis`` accepts; see :mod:`percolake.tools.chaos._nemesis`.
NEMESES: Final[tuple[str, ...]] = (
    "kill",
    "pause",
    "partition",
    "slow",
    "oracle-overlap",
    "leader-kill",
    "leader-pause",
    "leader-partition",
    "rolling-restart",
    "s3-pause",
    "s3-kill",
)
#: Faults that need the oracle on SQLite: the oracle-overlap run and its unsafe twin
#: (oracles without a claim) compare on the embedded store, where the suite runs them.
SQLITE_ORACLE_NEMESES: Final[frozenset[str]] = frozenset({"oracle-overlap"})
#: Faults that need the run to own its network (a namespace of its own).
NETWORK_NEMESES: Final[frozenset[str]] = frozenset({"partition", "slow", "leader-partition"})
#: Faults on a replicated control plane (``--replicas N``, N >= 2): the replica that
#: leads is found on the store's leader row when the fault begins.
REPLICA_NEMESES: Final[frozenset[str]] = frozenset(
    {"leader-kill", "leader-pause", "leader-partition", "rolling-restart"}
)

#: Faults on the run's own S3 server (``--warehouse s3``): MinIO stopped (SIGSTOP, healed
#: by SIGCONT) or killed -9 (healed by a restart on the same data and port).
S3_NEMESES: Final[frozenset[str]] = frozenset({"s3-pause", "s3-kill"})
#: Where the lakehouse workload's table lives: a folder of the run, or a bucket on a
#: MinIO the run starts in its work folder.
WAREHOUSES: Final[tuple[str, ...]] = ("local", "s3")

#: Environment variable that makes gateways commit with a deliberately broken protocol.
BROKEN_PROTOCOL_ENV: Final = "PERCOLAKE_UNSAFE_BROKEN_PROTOCOL"
#: Environment variable that makes oracles start without claiming their store (S7).
NO_ORACLE_CLAIM_ENV: Final = "PERCOLAKE_UNSAFE_NO_ORACLE_CLAIM"
#: Environment variable that makes a leading replica serve without checking its lease.
LEADER_IGNORES_LEASE_ENV: Final = "PERCOLAKE_UNSAFE_LEADER_IGNORES_LEASE"
#: Environment variable that gives gateways of the test build a short collection grace.
TEST_GC_GRACE_ENV: Final = "PERCOLAKE_TEST_GC_GRACE_MS"
#: How far a run may stretch past ``--duration-s``, as a share of it, when its faults run
#: late (a heal that waits for a takeover, servers slow to start on a loaded machine): the
#: faults after a late one keep their planned gaps and the clients run on, so that a
#: loaded machine carries out the whole schedule instead of dropping its end.
MAX_STRETCH: Final = 1.0


@dataclass(frozen=True, slots=True)
class RunConfig:
    """One bounded chaos run. ``seed`` alone decides the fault schedule and the workload."""

    workload: WorkloadName
    out_dir: Path
    duration_s: float = 60.0
    seed: int = 0
    nemeses: tuple[str, ...] = ("kill", "pause")
    isolation: IsolationName = "serializable"
    #: ``sqlite:///...`` or ``cassandra://...``; ``None``: SQLite files in the run folder,
    #: or the cluster of ``cassandra_nodes``.
    store_url: str | None = None
    cassandra_nodes: int = 0
    gateways: int = 2
    clients: int = 6
    #: Replicas of ``percolake serve`` (role all) on the store, one leading (0: one
    #: oracle and one lock server, no replicas). Clients and gateways get every
    #: replica's address and fail over by themselves.
    replicas: int = 0
    #: timestamps with replicas: an embedded oracle (``python -m percolake.tools.chaos.embedded``,
    #: the oracle an embedded manager builds) starts first and leads; the replicas follow,
    #: and the leader faults hit whichever of them leads.
    embedded: bool = False
    #: The replicas' leader lease (``--leader-lease-ms``); also the oracle's when
    #: ``replicas`` is 0.
    leader_lease_ms: int = 2_000
    #: Mean quiet time between two faults; each fault lasts its own drawn duration.
    fault_gap_s: float = 2.0
    #: Operations per second the clients start, all together (Jepsen's ``stagger``):
    #: each client waits a random 0 to ``2 * clients / rate`` seconds after an
    #: operation. ``None``: every client starts its next operation at once, a closed
    #: loop that takes all the CPU it can get.
    rate: float | None = None
    #: Lease on a committing transaction's locks: pauses are drawn longer than this.
    lease_ms: int = 2_000
    lock_wait_ms: int = 3_000
    resolve_wait_ms: int = 1_000
    idle_timeout_s: float = 8.0
    #: Client-side gRPC deadline; a commit whose reply does not come in time is settled.
    client_timeout_s: float = 10.0
    #: list-append: keys in use at once, and the length at which a key is retired for a
    #: fresh one (short lists keep reads cheap and histories small, as in Elle).
    active_keys: int = 8
    max_list_len: int = 32
    max_txn_len: int = 4
    #: bank: accounts and the balance each starts with.
    accounts: int = 8
    initial_balance: int = 100
    #: bank: transfers read both balances with ``get_for_update`` (each cell locked in
    #: the lock server, source first, then target), then write both. Two transfers in
    #: opposite directions lock in opposite orders, so deadlocks happen: the victim's
    #: abort is a failed operation. Full reads stay plain snapshot reads.
    pessimistic: bool = False
    #: lakehouse: files per commit and rows per file.
    files_per_commit: int = 4
    rows_per_file: int = 10
    #: lakehouse: the table's log retention in seconds (``None``: the table defaults,
    #: 30 days, so nothing expires). Set, clients also run ``Lakehouse.expire`` now and
    #: then, so versions expire during the run; the mark retention stays 7 days.
    lakehouse_log_retention_s: float | None = None
    #: lakehouse: ``local`` (a folder of the run) or ``s3``: the run starts its own MinIO
    #: (``percolake.tools.s3``) in its work folder, the table lives in a bucket there,
    #: clients write each file's object before committing it, and the checks also find
    #: every file the final versions name in the bucket.
    warehouse: Literal["local", "s3"] = "local"
    #: timestamps: deadline of one GetTimestamps call. Shorter than a leader pause, so
    #: a client pinned to a paused leader asks it again after the new leader served.
    ts_call_timeout_s: float = 0.5
    #: Use a network namespace of the run's own: "auto" when the run owns its store.
    netns: Literal["auto", "on", "off"] = "auto"
    #: Test only: gateways commit with locks skipped and the conflict check before the write.
    unsafe_broken_protocol: bool = False
    #: Test only: oracles start without claiming their store, so two may serve at once.
    unsafe_no_oracle_claim: bool = False
    #: Test only: a leading replica serves without checking that its lease is valid.
    unsafe_leader_ignores_lease: bool = False
    #: Servers of the control plane (replicas, the oracle) whose process was paused
    #: answer from their store only this many ms after the wake-up, as a store across a
    #: network would after a reconnect (0: off; see ``percolake.tools.chaos._reconnect``).
    store_reconnect_ms: int = 0
    gzip_history: bool = False
    #: Draw ``plot.png`` (latencies and outcomes over time, faults shaded): 1.4-1.7 CPU-s
    #: a run with matplotlib's import, which a run checked only by its report can skip.
    plot: bool = True
    #: Garbage collection in every gateway: a pass every this many seconds (None: off),
    #: keeping what transactions younger than the retention read (rules S8, S9).
    gc_interval_s: float | None = None
    gc_retention_s: float = 1.0
    #: With ``gc_interval_s``: the gateways' collection waits this long after raising
    #: the safe point (``None``: the default, 5 s). Set, gateways are the test build's
    #: collector (``PERCOLAKE_TEST_GC_GRACE_MS``): ``percolake serve`` has no such option.
    gc_grace_ms: int | None = None
    #: list-append through gateways: a commit with an unknown outcome is settled again
    #: this long after, through another gateway; a sample of the others too (see
    #: ``percolake.tools.chaos._late``). ``None``: off.
    late_settle_s: float | None = None
    cassandra_heap_mb: int = 1024
    #: Scratch folder (stores, Cassandra data, client logs); default ``out_dir/work``.
    work_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}: expected {', '.join(WORKLOADS)}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(
                f"unknown isolation {self.isolation!r}: expected snapshot|serializable"
            )
        for nemesis in self.nemeses:
            if nemesis not in NEMESES:
                raise ValueError(
                    f"unknown nemesis {nemesis!r}: expected a comma-separated subset of "
                    f"{','.join(NEMESES)} (or none)"
                )
        if not 1 <= self.duration_s <= 24 * 3600:
            raise ValueError(f"duration must be between 1 s and 24 h, got {self.duration_s}")
        overlap = SQLITE_ORACLE_NEMESES.intersection(self.nemeses)
        if overlap and not self.sqlite_oracle:
            raise ValueError(
                f"{','.join(sorted(overlap))} needs the oracle on SQLite: its unsafe twin "
                "(oracles without a claim) is compared there"
            )
        if overlap and self.replicas:
            raise ValueError(
                f"{','.join(sorted(overlap))} starts a second oracle next to the one of a run "
                "without replicas; with --replicas use leader-kill or rolling-restart"
            )
        on_replicas = REPLICA_NEMESES.intersection(self.nemeses)
        if on_replicas and self.replicas < 2:
            raise ValueError(
                f"{','.join(sorted(on_replicas))} needs a replicated control plane: "
                "--replicas 2 or more"
            )
        if self.embedded and (self.workload != "timestamps" or self.replicas < 1):
            raise ValueError(
                "--embedded runs an embedded oracle beside replicas under the timestamps "
                "workload: it needs --workload timestamps and --replicas 1 or more"
            )
        if self.rate is not None and not 0.1 <= self.rate <= 100_000:
            raise ValueError(f"--rate must be 0.1-100000 operations per second, got {self.rate}")
        if not 0 <= self.replicas <= 7:
            raise ValueError(f"--replicas must be 0-7, got {self.replicas}")
        if not 100 <= self.leader_lease_ms <= 60_000:
            raise ValueError(f"--leader-lease-ms must be 100-60000, got {self.leader_lease_ms}")
        if not 0 <= self.store_reconnect_ms <= 60_000:
            raise ValueError(f"--store-reconnect-ms must be 0-60000, got {self.store_reconnect_ms}")
        if not 0.05 <= self.ts_call_timeout_s <= 60:
            raise ValueError(f"--ts-call-timeout-s must be 0.05-60, got {self.ts_call_timeout_s}")
        if self.store_url is not None and self.cassandra_nodes:
            raise ValueError("--store and --cassandra-nodes exclude each other")
        if not 0 <= self.cassandra_nodes <= 9:
            raise ValueError(f"--cassandra-nodes must be 1-9, got {self.cassandra_nodes}")
        if self.store_url is not None and not self.store_url.startswith(
            ("sqlite:///", "cassandra://")
        ):
            raise ValueError(
                f"store {self.store_url!r}: a chaos run needs a store several processes share "
                "(sqlite:///... or cassandra://...)"
            )
        if self.gc_interval_s is not None and not 0.5 <= self.gc_interval_s <= 3600:
            raise ValueError(f"--gc-interval-s must be 0.5-3600, got {self.gc_interval_s}")
        if self.gc_retention_s < 0:
            raise ValueError(f"--gc-retention-s must be >= 0, got {self.gc_retention_s}")
        if self.gc_grace_ms is not None and (
            self.gc_interval_s is None or not 0 <= self.gc_grace_ms <= 60_000
        ):
            raise ValueError(
                f"--gc-grace-ms must be 0-60000 and needs --gc-interval-s, got {self.gc_grace_ms}"
            )
        if self.late_settle_s is not None and (
            self.workload != "list-append" or not 0 <= self.late_settle_s <= 600
        ):
            raise ValueError(
                "--late-settle-s must be 0-600 s and applies to --workload list-append, "
                f"got {self.late_settle_s} ({self.workload})"
            )
        if not 1 <= self.gateways <= 8:
            raise ValueError(f"--gateways must be 1-8, got {self.gateways}")
        if not 1 <= self.clients <= 64:
            raise ValueError(f"--clients must be 1-64, got {self.clients}")
        if self.fault_gap_s < 0:
            raise ValueError("--fault-gap-s must not be negative")
        if self.active_keys < 1 or self.max_txn_len < 1 or self.max_list_len < 1:
            raise ValueError("list-append needs at least one key and one micro-op per txn")
        if self.accounts < 2 or self.initial_balance < 1:
            raise ValueError("bank needs at least two accounts with a positive balance")
        if not isinstance(self.pessimistic, bool):
            raise ValueError(f"pessimistic must be true or false, got {self.pessimistic!r}")
        if self.pessimistic and self.workload != "bank":
            raise ValueError(f"--pessimistic applies to --workload bank only, not {self.workload}")
        if self.files_per_commit < 1 or self.rows_per_file < 1:
            raise ValueError("lakehouse commits need at least one file of one row")
        retention = self.lakehouse_log_retention_s
        if retention is not None:
            if isinstance(retention, bool) or not isinstance(retention, int | float):
                raise ValueError(
                    f"--lakehouse-log-retention-s must be a number of seconds, got {retention!r}"
                )
            if not math.isfinite(retention) or retention < 0:
                raise ValueError(
                    f"--lakehouse-log-retention-s must be a finite number >= 0, got {retention}"
                )
            if self.workload != "lakehouse":
                raise ValueError(
                    "--lakehouse-log-retention-s applies to --workload lakehouse only, "
                    f"not {self.workload}"
                )
        if self.warehouse not in WAREHOUSES:
            raise ValueError(
                f"unknown warehouse {self.warehouse!r}: expected {'|'.join(WAREHOUSES)}"
            )
        if self.warehouse == "s3" and self.workload != "lakehouse":
            raise ValueError(
                f"--warehouse s3 applies to --workload lakehouse only, not {self.workload}"
            )
        on_s3 = S3_NEMESES.intersection(self.nemeses)
        if on_s3 and self.warehouse != "s3":
            raise ValueError(
                f"{','.join(sorted(on_s3))} injects faults into the run's S3 server: "
                "it needs --workload lakehouse --warehouse s3"
            )
        if self.lease_ms < 100 or self.client_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("lease, client timeout and idle timeout must be positive")

    @property
    def owns_store(self) -> bool:
        """Whether this run starts its own store (SQLite files or a Cassandra cluster)."""
        return self.store_url is None or self.store_url.startswith("sqlite:")

    @property
    def sqlite_oracle(self) -> bool:
        """Whether the oracle keeps its bound in SQLite (a file of the run's own)."""
        return not self.cassandra_nodes and not (
            self.store_url is not None and self.store_url.startswith("cassandra://")
        )

    @property
    def work(self) -> Path:
        return self.work_dir if self.work_dir is not None else self.out_dir / "work"

    @property
    def uses_transactions(self) -> bool:
        """Whether the workload runs transactions (gateways, lock server); the
        timestamps workload only asks the oracle."""
        return self.workload != "timestamps"

    @property
    def network_faults(self) -> bool:
        return any(n in NETWORK_NEMESES for n in self.nemeses)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["out_dir"] = str(self.out_dir)
        data["work_dir"] = None if self.work_dir is None else str(self.work_dir)
        data["nemeses"] = list(self.nemeses)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["out_dir"] = Path(kwargs["out_dir"])
        if kwargs.get("work_dir") is not None:
            kwargs["work_dir"] = Path(kwargs["work_dir"])
        kwargs["nemeses"] = tuple(kwargs.get("nemeses", ()))
        return cls(**kwargs)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        loaded: dict[str, Any] = json.loads(path.read_text())
        return cls.from_json(loaded)
