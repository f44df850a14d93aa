"""The one place that turns transaction types into protobuf and back."""

from __future__ import annotations

from txn._isolation import Isolation, TransactionStatus
from wire.v1 import transaction_pb2 as pb

_ISOLATION_TO_PB = {
    Isolation.SNAPSHOT: pb.ISOLATION_SNAPSHOT,
    Isolation.SERIALIZABLE: pb.ISOLATION_SERIALIZABLE,
}
_ISOLATION_FROM_PB = {v: k for k, v in _ISOLATION_TO_PB.items()}
_ISOLATION_FROM_PB[pb.ISOLATION_UNSPECIFIED] = Isolation.SNAPSHOT

_STATE_TO_PB = {
    TransactionStatus.ACTIVE: pb.TRANSACTION_STATE_ACTIVE,
    TransactionStatus.COMMITTING: pb.TRANSACTION_STATE_COMMITTING,
    TransactionStatus.COMMITTED: pb.TRANSACTION_STATE_COMMITTED,
    TransactionStatus.ABORTED: pb.TRANSACTION_STATE_ABORTED,
    TransactionStatus.UNKNOWN: pb.TRANSACTION_STATE_UNKNOWN,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}


def isolation_to_pb(isolation: Isolation) -> pb.Isolation.ValueType:
    return _ISOLATION_TO_PB[isolation]


def isolation_from_pb(value: int) -> Isolation:
    try:
        return _ISOLATION_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(
            f"unknown isolation {value}: expected ISOLATION_SNAPSHOT or ISOLATION_SERIALIZABLE"
        ) from None


def state_to_pb(status: TransactionStatus) -> pb.TransactionState.ValueType:
    return _STATE_TO_PB[status]


def state_from_pb(value: int) -> TransactionStatus:
    try:
        return _STATE_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown transaction state {value}") from None
