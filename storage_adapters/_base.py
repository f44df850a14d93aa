"""The ``KVStore`` seam: a small, batched, multi-version key-value interface.

Every backend implements :class:`KVStore`; the memory backend is the reference
implementation and every backend passes the same contract suite
(``tests/contract``).

Two kinds of data live in a store:

* **versioned cells** ``(table, row, column, ts) -> value``: what transactions
  write. ``value`` is ``bytes`` or ``None`` for a tombstone (a delete).
* **system rows** ``(table, key) -> value``: small rows that need linearizable
  updates (the transactions table, the oracle's upper bound). They are written
  only with :meth:`KVStore.put_unless_exists` and :meth:`KVStore.compare_and_set`
  and read with :meth:`KVStore.get_system`.

Versioned tables and system tables share one namespace of table names but are
stored apart; the transaction layer keeps its system tables under names that
start with ``_`` so user tables can never collide with them.
"""

from __future__ import annotations

import abc
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from percolake.errors import StoreError, StoreTimeoutError, StoreUnavailableError

#: Timestamps are non-negative integers below this bound (they fit a signed 64-bit column).
MAX_TIMESTAMP = (1 << 63) - 1

_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_ROLE_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")


class Cell(NamedTuple):
    """A cell of a table: one ``(row, column)`` pair."""

    row: bytes
    column: bytes


class Version(NamedTuple):
    """One version of a cell: written by the transaction that started at ``ts``."""

    ts: int
    value: bytes | None  # None is a tombstone


class ScanEntry(NamedTuple):
    """A cell and its newest version below the scan timestamp."""

    row: bytes
    column: bytes
    ts: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class VersionWrite:
    """A version to write: ``value=None`` writes a tombstone."""

    row: bytes
    column: bytes
    ts: int
    value: bytes | None


class CasResult(NamedTuple):
    """Outcome of a conditional write: whether it applied, and the value now stored."""

    applied: bool
    current: bytes | None


class StoreClaimedError(StoreError):
    """Another holder has the exclusive claim on a role of this store (see :meth:`KVStore.claim`).

    ``holder`` says who, as far as the backend can tell (``"pid 1234"``), and ``where``
    what the claim is held on (a lock file), for the operator.
    """

    def __init__(self, message: str, *, role: str, holder: str | None, where: str) -> None:
        super().__init__(message)
        self.role = role
        self.holder = holder
        self.where = where


class Claim:
    """An exclusive claim on one role of one store, held until :meth:`release`.

    ``exclusive`` is ``False`` for a backend that cannot tell whether another process
    holds the role: such a claim guards nothing. Releasing is idempotent; closing the
    store releases its claims, and so does the death of the process for backends
    whose claims are OS locks.
    """

    def __init__(
        self, role: str, where: str, *, exclusive: bool, on_release: Callable[[], None] | None
    ) -> None:
        self.role = role
        self.where = where
        self.exclusive = exclusive
        self._on_release = on_release
        self._lock = threading.Lock()
        self._held = True

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
            on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release()

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._held else "released"
        kind = "exclusive" if self.exclusive else "not exclusive"
        return f"Claim({self.role!r} on {self.where}, {kind}, {state})"


def check_role(role: object) -> str:
    """Validate a claim's role name: lower-case letters, digits and ``-``."""
    if not isinstance(role, str):
        raise TypeError(f"role must be str, got {type(role).__name__}")
    if not _ROLE_NAME.fullmatch(role):
        raise ValueError(f"invalid role {role!r}: expected [a-z][a-z0-9-]{{0,63}}")
    return role


def check_table(table: object) -> str:
    """Validate a table name, raising ``TypeError``/``ValueError`` that names the problem."""
    if not isinstance(table, str):
        raise TypeError(f"table name must be str, got {type(table).__name__}")
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(
            f"invalid table name {table!r}: expected 1-128 characters from [A-Za-z0-9_.-]"
        )
    return table


def check_key(kind: str, key: object, *, allow_empty: bool = False) -> bytes:
    """Validate a row, column or system key: non-empty ``bytes``."""
    if not isinstance(key, bytes):
        raise TypeError(f"{kind} must be bytes, got {type(key).__name__}")
    if not key and not allow_empty:
        raise ValueError(f"{kind} must not be empty")
    return key


def check_value(value: object) -> bytes:
    """Validate a cell value: ``bytes`` (possibly empty)."""
    if not isinstance(value, bytes):
        raise TypeError(f"value must be bytes, got {type(value).__name__}")
    return value


def check_ts(name: str, ts: object) -> int:
    """Validate a timestamp: an ``int`` in ``[0, MAX_TIMESTAMP]``."""
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise TypeError(f"{name} must be int, got {type(ts).__name__}")
    if not 0 <= ts <= MAX_TIMESTAMP:
        raise ValueError(f"{name} must be in [0, {MAX_TIMESTAMP}], got {ts}")
    return ts


def check_scan(
    table: object,
    start_row: object,
    end_row: object,
    below_ts: object,
    start_column: object,
    page_size: object,
) -> None:
    """Validate the arguments of :meth:`KVStore.scan` before any I/O."""
    check_table(table)
    check_key("start_row", start_row, allow_empty=True)
    if end_row is not None:
        check_key("end_row", end_row, allow_empty=True)
    check_key("start_column", start_column, allow_empty=True)
    check_ts("below_ts", below_ts)
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")


def check_cells(cells: Iterable[tuple[bytes, bytes]]) -> list[Cell]:
    """Validate and normalise a batch of ``(row, column)`` pairs."""
    out = []
    for cell in cells:
        if not isinstance(cell, tuple) or len(cell) != 2:
            raise TypeError(f"a cell must be a (row, column) tuple, got {cell!r}")
        out.append(Cell(check_key("row", cell[0]), check_key("column", cell[1])))
    return out


def check_writes(versions: Iterable[VersionWrite]) -> list[VersionWrite]:
    """Validate a batch of version writes before any I/O."""
    out = []
    for v in versions:
        if not isinstance(v, VersionWrite):
            raise TypeError(f"expected VersionWrite, got {type(v).__name__}")
        check_key("row", v.row)
        check_key("column", v.column)
        check_ts("ts", v.ts)
        if v.value is not None:
            check_value(v.value)
        out.append(v)
    return out


class KVStore(abc.ABC):
    """A multi-version key-value store, batched everywhere.

    Implementations are safe to share between threads. Every method validates
    its arguments before any I/O and raises ``TypeError``/``ValueError`` naming
    the problem. Tables need no DDL: any valid table name can be used at any time.
    """

    # --- versioned cells -------------------------------------------------------

    @abc.abstractmethod
    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        """Write versions of cells.

        Idempotent: writing the same ``(row, column, ts)`` again replaces its value
        (the transaction layer only ever rewrites a version with the same value).
        Not atomic across versions: after a failure any subset may have been
        written, which the transaction protocol tolerates (rule S2).
        """

    @abc.abstractmethod
    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        """For each cell, its newest version with ``ts < below_ts``.

        Cells with no such version are left out of the result. Tombstones are
        returned (``value=None``): visibility is the transaction layer's call.
        """

    @abc.abstractmethod
    def scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        *,
        start_column: bytes = b"",
        page_size: int = 1000,
    ) -> Iterator[ScanEntry]:
        """Iterate cells with ``start_row <= row < end_row`` in ``(row, column)`` order.

        Each cell yields its newest version with ``ts < below_ts`` (tombstones
        included). ``end_row=None`` means no upper bound. ``start_column`` skips
        the columns of ``start_row`` that sort before it (a cursor to resume from).
        Backends fetch ``page_size`` cells at a time; the iterator is lazy and not
        a consistent snapshot of concurrent writes at or above ``below_ts``.
        """

    @abc.abstractmethod
    def get_version_timestamps(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        above_ts: int = -1,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[int]]:
        """For each cell, the timestamps ``above_ts < ts < below_ts`` of its versions.

        Newest first, at most ``limit`` per cell. Cells without such versions are
        left out. Used by write-write conflict checks.
        """

    @abc.abstractmethod
    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        """Remove versions ``(row, column, ts)``; missing ones are ignored (idempotent)."""

    # --- system rows -----------------------------------------------------------

    @abc.abstractmethod
    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        """Insert ``key -> value`` only if ``key`` has no value: linearizable (rule S1).

        Returns ``CasResult(True, value)`` when this call wrote it, else
        ``CasResult(False, existing)``. Re-issuing the same call after an unknown
        outcome is safe: finding ``existing == value`` means an earlier attempt won.
        Raises :class:`StoreTimeoutError` when the outcome is unknown.
        """

    @abc.abstractmethod
    def compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> CasResult:
        """Set ``key -> value`` only if its current value is ``expected`` (``None``: absent).

        Linearizable. Returns whether it applied and the value stored afterwards.
        Raises :class:`StoreTimeoutError` when the outcome is unknown.
        """

    @abc.abstractmethod
    def get_system(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """Read system rows linearizably (Cassandra: SERIAL); absent keys left out."""

    # --- exclusive roles -------------------------------------------------------

    def claim(self, role: str) -> Claim:
        """Hold ``role`` (e.g. ``"oracle"``) on this store exclusively until released.

        Raises :class:`StoreClaimedError` naming the holder when another claim on the
        same store holds ``role``, whether it was taken through this handle, another
        handle in this process or another process. Not reentrant. Closing the store
        releases the claims taken through it.

        This default is for backends that cannot tell (Cassandra today): it returns a
        claim with ``exclusive=False`` that guards nothing, and the oracle's
        compare-and-set fencing is all there is until leader leases exist (S7).
        """
        check_role(role)
        return Claim(role, self.url, exclusive=False, on_release=None)

    # --- lifecycle -------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and files. Idempotent."""

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        """The URL this store was opened with (for logs)."""
        return getattr(self, "_url", type(self).__name__)


#: Re-exported: the store errors live in the one error root (percolake.errors).
__all__ = ["StoreError", "StoreTimeoutError", "StoreUnavailableError"]
