"""The timestamp oracle (TSO): timestamps that never repeat or go backwards (rule S7)."""

from tso._batcher import TimestampBatcher
from tso._oracle import (
    BOUND_KEY,
    DEFAULT_WINDOW,
    TSO_TABLE,
    OracleAlreadyRunningError,
    TimestampOracle,
    TimestampRange,
)
from wire.errors import OracleFencedError

__all__ = [
    "BOUND_KEY",
    "DEFAULT_WINDOW",
    "TSO_TABLE",
    "OracleAlreadyRunningError",
    "OracleFencedError",
    "TimestampBatcher",
    "TimestampOracle",
    "TimestampRange",
]
