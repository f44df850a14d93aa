"""The one transaction interface: what every caller types against.

The embedded manager (oracle, locks and store in this process) and the remote one
(through a ``percolake serve`` gateway) both satisfy these protocols under mypy
strict, so the lakehouse, the chaos harness and the benchmarks never ask which
one they hold. As in FoundationDB's bindings, the read-only part is a base the
writable transaction extends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from txn._isolation import Isolation, TransactionStatus

T = TypeVar("T")


class ReadTransaction(Protocol):
    """Reads at one snapshot (``start_ts``), the transaction's own writes included."""

    @property
    def id(self) -> str:
        """Opaque identifier, unique across every manager on the same store."""
        ...

    @property
    def start_ts(self) -> int: ...

    @property
    def isolation(self) -> Isolation: ...

    @property
    def status(self) -> TransactionStatus: ...

    def get(self, table: str, row: bytes, column: bytes) -> bytes | None:
        """The cell's value at this snapshot; ``None`` when absent or deleted."""
        ...

    def get_many(
        self, table: str, cells: Iterable[tuple[bytes, bytes]]
    ) -> dict[tuple[bytes, bytes], bytes]:
        """Values of many cells in one round trip; absent or deleted cells left out."""
        ...

    def get_many_of_tables(
        self, reads: Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]
    ) -> list[dict[tuple[bytes, bytes], bytes]]:
        """``get_many`` of each ``(table, cells)``, in the order of ``reads``: the same
        values at the same snapshot, with as few round trips as the manager allows
        (embedded: one store read for every table)."""
        ...

    def scan(
        self, table: str, start_row: bytes = b"", end_row: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes, bytes]]:
        """``(row, column, value)`` for ``start_row <= row < end_row``, sorted, each once."""
        ...


class Transaction(ReadTransaction, Protocol):
    """A transaction that may write; belongs to one thread."""

    @property
    def commit_ts(self) -> int | None:
        """Set once committed."""
        ...

    def get_for_update(self, table: str, row: bytes, column: bytes) -> bytes | None:
        """Lock the cell (waiting in the lock server's queue) and return its latest
        committed value, or this transaction's own write of it; ``None`` when absent.

        A lock-wait timeout or a deadlock (``DeadlockError``, reason ``deadlock``) raises a
        ``TransactionConflictError`` and aborts the transaction.
        """
        ...

    def put(self, table: str, row: bytes, column: bytes, value: bytes) -> None: ...

    def delete(self, table: str, row: bytes, column: bytes) -> None: ...

    def commit(self) -> int:
        """Commit; returns the commit timestamp.

        ``TransactionAbortedError``: definitely not committed. ``CommitUnknownError``:
        the outcome could not be settled (rule S6); never retry blindly.
        """
        ...

    def abort(self) -> None: ...

    def __enter__(self) -> Transaction: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class Manager(Protocol):
    """Begins transactions; safe to share between threads."""

    def begin(self, isolation: Isolation = Isolation.SNAPSHOT) -> Transaction: ...

    def run(
        self,
        fn: Callable[[Transaction], T],
        isolation: Isolation = Isolation.SNAPSHOT,
        max_attempts: int = 10,
        *,
        pessimistic: bool = False,
    ) -> T:
        """``fn(tx)`` and commit, retried only on conflicts (definitely not committed).

        ``pessimistic``: each attempt's ``get`` of a cell is a ``get_for_update``.
        """
        ...

    def attach(self, txn_id: str) -> Transaction:
        """Join a transaction another process began (remote only; embedded: an error)."""
        ...

    def outcome(self, txn_id: str, *, settle: bool = False) -> TransactionStatus | None:
        """``COMMITTED``/``ABORTED`` once decided, else ``None``.

        With ``settle`` the answer is final and fences: a transaction still undecided
        (even one whose Commit is on its way) can no longer commit afterwards.
        """
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Manager: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


if TYPE_CHECKING:  # both implementations satisfy the protocols; mypy checks it here
    from txn._manager import TransactionManager
    from txn.remote import RemoteTransactionManager

    def _embedded(manager: TransactionManager) -> Manager:
        return manager

    def _remote(manager: RemoteTransactionManager) -> Manager:
        return manager
