"""The lock server: leased exclusive locks for liveness (rule S5), never for safety."""

from lockserver._table import (
    MAX_DESCRIPTOR_BYTES,
    MAX_LEASE_MS,
    LockTable,
    LockTableClosedError,
    LockToken,
    render_descriptor,
)
from lockserver._waits import LockWait
from wire.errors import StaleTokenError

__all__ = [
    "MAX_DESCRIPTOR_BYTES",
    "MAX_LEASE_MS",
    "LockTable",
    "LockTableClosedError",
    "LockToken",
    "LockWait",
    "StaleTokenError",
    "render_descriptor",
]
