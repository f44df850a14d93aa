"""The timestamp oracle (TSO): timestamps that never repeat or go backwards (rule S7)."""

from percolake.errors import OracleFencedError
from tso._batcher import TimestampBatcher
from tso._oracle import (
    BOUND_KEY,
    DEFAULT_WINDOW,
    TSO_TABLE,
    OracleAlreadyRunningError,
    TimestampOracle,
    TimestampRange,
)

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
