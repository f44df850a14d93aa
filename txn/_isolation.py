from __future__ import annotations

import enum


class Isolation(enum.Enum):
    """Isolation levels: snapshot isolation, or serializable on top of it
    (docs/design/protocol.md)."""

    SNAPSHOT = "snapshot"
    SERIALIZABLE = "serializable"


class TransactionStatus(enum.Enum):
    """Where a transaction is in its life; only ACTIVE accepts reads and writes."""

    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"  # the commit point's outcome could not be settled
