"""What ``percolake serve`` is asked to run: :class:`ServeConfig`, checked as it is built."""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_integration.service import LakehouseLimits
from tso import DEFAULT_LEADER_WAIT_S, DEFAULT_LEASE_MS, check_lease_ms
from txn import TransactionConfig
from txn.gateway import GatewayLimits
from wire.auth import TlsConfig
from wire.channels import DEFAULT_MAX_MESSAGE_BYTES, parse_address, parse_addresses

ROLES = ("all", "tso", "locks", "txn")
DEFAULT_STORE = "sqlite:///.percolake/store.db"
DEFAULT_LISTEN = "127.0.0.1:7070"
#: A call waiting longer than this for a leader would outlast every client deadline.
MAX_LEADER_WAIT_S = 300.0


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
    #: How long a call waits for a leader (an election, a store outage) before it
    #: fails with ``NoLeaderError`` naming the cause.
    leader_wait_s: float = DEFAULT_LEADER_WAIT_S
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
    #: ``serve locks --store URL``: lock server replicas, elected on the store.
    locks_on_store: bool = False

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
        if not 0 < self.leader_wait_s <= MAX_LEADER_WAIT_S:
            raise ValueError(
                f"--leader-wait-s must be in (0, {MAX_LEADER_WAIT_S:g}], got {self.leader_wait_s}"
            )
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


def _check_metrics_listen(metrics_listen: str, listen: str) -> None:
    try:
        host, port = parse_address(metrics_listen)
    except ValueError as exc:
        raise ValueError(f"--metrics-listen: {exc}") from None
    if port != 0 and (host, port) == parse_address(listen):
        raise ValueError(f"--metrics-listen {metrics_listen} is the gRPC address (--listen)")
