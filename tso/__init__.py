"""The timestamp oracle (TSO): timestamps that never repeat or go backwards (rule S7)."""

from tso._batcher import TimestampBatcher
from tso._lease import (
    DEFAULT_LEADER_WAIT_S,
    DEFAULT_LEASE_MS,
    DRIFT_MARGIN,
    LEADER_TABLE,
    WARNING_INTERVAL_S,
    LeaderLease,
    LeaseRecord,
    LeaseView,
    RateLimitedWarning,
    check_lease_ms,
)
from tso._oracle import (
    BOUND_KEY,
    DEFAULT_WINDOW,
    ORACLE_ROLE,
    TSO_TABLE,
    OracleAlreadyRunningError,
    TimestampOracle,
    TimestampRange,
)
from wire.errors import OracleFencedError

__all__ = [
    "BOUND_KEY",
    "DEFAULT_LEADER_WAIT_S",
    "DEFAULT_LEASE_MS",
    "DEFAULT_WINDOW",
    "DRIFT_MARGIN",
    "LEADER_TABLE",
    "ORACLE_ROLE",
    "TSO_TABLE",
    "WARNING_INTERVAL_S",
    "LeaderLease",
    "LeaseRecord",
    "LeaseView",
    "OracleAlreadyRunningError",
    "OracleFencedError",
    "RateLimitedWarning",
    "TimestampBatcher",
    "TimestampOracle",
    "TimestampRange",
    "check_lease_ms",
]
