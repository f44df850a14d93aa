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

Limits. Every backend refuses, with ``ValueError`` naming the limit and the actual
size and before any I/O, what the most restrictive backend (Cassandra) cannot store,
so that an application tested on memory or SQLite runs unchanged on Cassandra:

* a cell's ``row`` and ``column`` together hold at most :data:`MAX_CELL_KEY_BYTES`
  (so a row at most :data:`MAX_ROW_BYTES`): reads, writes and deletes of cells;
* a system row's table name and ``key`` together at most :data:`MAX_SYSTEM_KEY_BYTES`;
* a cell value at most :data:`MAX_VALUE_BYTES`, a system value at most
  :data:`MAX_SYSTEM_VALUE_BYTES`.

Scan bounds (``start_row``, ``start_column``, ``end_row``) are bounds, not stored keys:
any length is accepted, and ``page_size`` is any positive int (read as at most
:data:`MAX_PAGE_SIZE`). The numbers were measured on a real node; see each constant.
"""

from __future__ import annotations

import abc
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from wire.errors import StoreError

#: Timestamps are non-negative integers below this bound (they fit a signed 64-bit column).
MAX_TIMESTAMP = (1 << 63) - 1

#: The most bytes a cell's row and column hold together. Cassandra keeps a version's
#: ``(row, column, ts)`` as one clustering key, and a clustering key may hold at most
#: 65,535 bytes (an unsigned short) counting every component: row + column + 8 (``ts``,
#: a bigint). Measured on Cassandra 5.0.9 through this schema, for columns of 1, 1,000,
#: 30,000 and 65,000 bytes: row + column = 65,527 is stored and read back (also after a
#: flush to an SSTable), 65,528 is refused with "Key length of 65536 is longer than
#: maximum of 65535". Memory and SQLite enforce it too.
MAX_CELL_KEY_BYTES = 65_535 - 8
#: The longest row: a column holds at least one byte.
MAX_ROW_BYTES = MAX_CELL_KEY_BYTES - 1
#: The most bytes a system row's table name and key hold together. Cassandra's partition
#: key ``(tbl, key)`` of ``system_rows`` is a composite of at most 65,535 bytes with
#: 2 (length) + 1 (end of component) bytes around each component. Measured on Cassandra
#: 5.0.9 with table names of 1, 4 and 128 characters: table + key = 65,529 bytes is
#: stored, 65,530 refused ("Key length of 65536 ..."), by writes and reads alike.
MAX_SYSTEM_KEY_BYTES = 65_535 - 6
#: The largest cell value: 15 MiB. Cassandra refuses a request over its native
#: transport's message limit (``native_transport_max_message_size``, 16 MiB by default:
#: "CQL Message of size 16777217 bytes exceeds allowed maximum of 16777216 bytes") and a
#: mutation over ``max_mutation_size`` (half of the 32 MiB commit log segment: 16 MiB).
#: Measured: a version insert carries about 100 bytes besides its key and value, so
#: with the largest key a value of 16 MiB - 65,625 bytes still fits. The 1 MiB margin
#: covers the key, the table name and the protocol's own fields. A write batch never
#: puts a value this large next to another write (``cassandra.batched``: only writes
#: adding up to 4 KiB share a batch), so no request outgrows the single largest write.
MAX_VALUE_BYTES = 15 * 1024 * 1024
#: The largest system value: half of :data:`MAX_VALUE_BYTES`, because a compare-and-set
#: sends the expected and the new value in one request. Measured: with two values of
#: 8 MiB - 32,539 bytes the request reaches the 16 MiB message limit; a conditional
#: write of one value above 16 MiB - 131,345 bytes (largest key) fails on the replica
#: after it was sent (a ``WriteTimeout`` or ``WriteFailure``: an unknown outcome), so it
#: must be refused before it is sent.
MAX_SYSTEM_VALUE_BYTES = MAX_VALUE_BYTES // 2
#: Scans read at most this many cells per request, whatever ``page_size`` asks for
#: (CQL's ``LIMIT`` is a 32-bit int); paging is invisible to callers.
MAX_PAGE_SIZE = (1 << 31) - 1

_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_ROLE_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")


class Cell(NamedTuple):
    """A cell of a table: one ``(row, column)`` pair."""

    row: bytes
    column: bytes


class Version(NamedTuple):
    """One version of a cell: written by the transaction that started at ``ts``.

    ``commit_ts`` is the writer's commit stamp once garbage collection wrote one
    (:meth:`KVStore.stamp_versions`): a stamped version's outcome needs no lookup in the
    transactions table (rule S9). ``None`` means not stamped, not "not committed".
    """

    ts: int
    value: bytes | None  # None is a tombstone
    commit_ts: int | None = None


class ScanEntry(NamedTuple):
    """A cell and its newest version below the scan timestamp (``commit_ts``: its
    commit stamp, as in :class:`Version`)."""

    row: bytes
    column: bytes
    ts: int
    value: bytes | None
    commit_ts: int | None = None


@dataclass(frozen=True, slots=True)
class VersionWrite:
    """A version to write: ``value=None`` writes a tombstone."""

    row: bytes
    column: bytes
    ts: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class VersionStamp:
    """A commit stamp to write on the version ``(row, column, ts)``: its writer
    committed at ``commit_ts``."""

    row: bytes
    column: bytes
    ts: int
    commit_ts: int


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
    """Validate a row, column or system key: non-empty ``bytes`` (sizes: see below)."""
    if not isinstance(key, bytes):
        raise TypeError(f"{kind} must be bytes, got {type(key).__name__}")
    if not key and not allow_empty:
        raise ValueError(f"{kind} must not be empty")
    return key


def check_cell(row: object, column: object) -> Cell:
    """Validate a cell: non-empty ``bytes`` row and column of at most
    :data:`MAX_CELL_KEY_BYTES` together."""
    cell = Cell(check_key("row", row), check_key("column", column))
    size = len(cell.row) + len(cell.column)
    if size > MAX_CELL_KEY_BYTES:
        raise ValueError(
            f"row and column are {size} bytes together; a cell holds at most "
            f"{MAX_CELL_KEY_BYTES} (MAX_CELL_KEY_BYTES: Cassandra's clustering key "
            "(row, column, ts) holds at most 65535 bytes, 8 of them the timestamp)"
        )
    return cell


def check_system_key(table: str, key: object) -> bytes:
    """Validate a system row's key: non-empty ``bytes`` of at most
    :data:`MAX_SYSTEM_KEY_BYTES` together with the (already checked) table name."""
    key = check_key("key", key)
    size = len(table) + len(key)
    if size > MAX_SYSTEM_KEY_BYTES:
        raise ValueError(
            f"system table name and key are {size} bytes together ({len(key)} of them the "
            f"key); a system row holds at most {MAX_SYSTEM_KEY_BYTES} (MAX_SYSTEM_KEY_BYTES: "
            "Cassandra's partition key (table, key) holds at most 65535 bytes, 6 of them "
            "framing)"
        )
    return key


def check_value(value: object) -> bytes:
    """Validate a cell value: ``bytes`` (possibly empty) of at most :data:`MAX_VALUE_BYTES`."""
    return _check_value("value", value, MAX_VALUE_BYTES, "MAX_VALUE_BYTES")


def check_system_value(name: str, value: object) -> bytes:
    """Validate a system row's value: ``bytes`` of at most :data:`MAX_SYSTEM_VALUE_BYTES`."""
    return _check_value(name, value, MAX_SYSTEM_VALUE_BYTES, "MAX_SYSTEM_VALUE_BYTES")


def check_system_write(
    table: object, key: object, value: object, *, expected: object = None
) -> None:
    """Validate a conditional write of a system row (``put_unless_exists``,
    ``compare_and_set`` with its ``expected`` value) before any I/O."""
    check_system_key(check_table(table), key)
    if expected is not None:
        check_system_value("expected", expected)
    check_system_value("value", value)


def check_system_deletes(table: str, rows: Sequence[tuple[bytes, bytes]]) -> None:
    """Check ``(key, expected)`` pairs of :meth:`KVStore.delete_system_many`: each as
    :func:`check_system_write`, and no key twice."""
    seen: set[bytes] = set()
    for key, expected in rows:
        check_system_write(table, key, expected)
        if key in seen:
            raise ValueError(f"delete_system_many names key {key[:40]!r} of {table!r} twice")
        seen.add(key)


def _check_value(name: str, value: object, limit: int, limit_name: str) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    if len(value) > limit:
        raise ValueError(
            f"{name} is {len(value)} bytes; at most {limit} ({limit_name}: a Cassandra "
            "request holds at most 16 MiB)"
        )
    return value


def check_ts(name: str, ts: object) -> int:
    """Validate a timestamp: an ``int`` in ``[0, MAX_TIMESTAMP]``."""
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise TypeError(f"{name} must be int, got {type(ts).__name__}")
    if not 0 <= ts <= MAX_TIMESTAMP:
        raise ValueError(f"{name} must be in [0, {MAX_TIMESTAMP}], got {ts}")
    return ts


def check_count(name: str, count: object) -> int:
    """Validate a page size or limit: a positive ``int`` (``bool`` is not a count)."""
    if not isinstance(count, int) or isinstance(count, bool):
        raise TypeError(f"{name} must be int, got {type(count).__name__}")
    if count < 1:
        raise ValueError(f"{name} must be a positive int, got {count}")
    return count


def check_scan(
    table: object,
    start_row: object,
    end_row: object,
    below_ts: object,
    start_column: object,
    page_size: object,
) -> int:
    """Validate the arguments of :meth:`KVStore.scan` before any I/O.

    The bounds may have any length: they are compared with stored keys, never stored.
    Returns the page size to read with: ``page_size``, at most :data:`MAX_PAGE_SIZE`.
    """
    check_table(table)
    check_scan_bounds(start_row, end_row, start_column)
    check_ts("below_ts", below_ts)
    return min(check_count("page_size", page_size), MAX_PAGE_SIZE)


def check_scan_bounds(start_row: object, end_row: object, start_column: object = b"") -> None:
    """Validate a scan's bounds: ``bytes`` of any length (``end_row`` may be ``None``)."""
    check_key("start_row", start_row, allow_empty=True)
    if end_row is not None:
        check_key("end_row", end_row, allow_empty=True)
    check_key("start_column", start_column, allow_empty=True)


def check_limit(limit: object) -> int | None:
    """Validate :meth:`KVStore.get_version_timestamps`' ``limit``: ``None`` or a positive int."""
    return None if limit is None else check_count("limit", limit)


def check_cells(cells: Iterable[tuple[bytes, bytes]]) -> list[Cell]:
    """Validate and normalise a batch of ``(row, column)`` pairs."""
    if isinstance(cells, tuple | bytes | str):
        raise TypeError("cells must be an iterable of (row, column) tuples")
    out = []
    for cell in cells:
        if not isinstance(cell, tuple) or len(cell) != 2:
            raise TypeError(f"a cell must be a (row, column) tuple, got {cell!r}")
        out.append(check_cell(cell[0], cell[1]))
    return out


def check_writes(versions: Iterable[VersionWrite]) -> list[VersionWrite]:
    """Validate a batch of version writes before any I/O."""
    out = []
    for v in versions:
        if not isinstance(v, VersionWrite):
            raise TypeError(f"expected VersionWrite, got {type(v).__name__}")
        check_cell(v.row, v.column)
        check_ts("ts", v.ts)
        if v.value is not None:
            check_value(v.value)
        out.append(v)
    return out


def check_deletes(versions: Iterable[tuple[bytes, bytes, int]]) -> list[tuple[Cell, int]]:
    """Validate a batch of ``(row, column, ts)`` versions to delete before any I/O."""
    out = []
    for entry in versions:
        if not isinstance(entry, tuple) or len(entry) != 3:
            raise TypeError(f"a version to delete must be (row, column, ts), got {entry!r}")
        out.append((check_cell(entry[0], entry[1]), check_ts("ts", entry[2])))
    return out


def check_ranges(
    ranges: Iterable[tuple[bytes, bytes, int, int]],
) -> list[tuple[Cell, int, int]]:
    """Validate a batch of ``(row, column, low_ts, high_ts)`` version ranges to delete
    (both ends included, ``low_ts <= high_ts``) before any I/O."""
    out = []
    for entry in ranges:
        if not isinstance(entry, tuple) or len(entry) != 4:
            raise TypeError(
                f"a version range must be (row, column, low_ts, high_ts), got {entry!r}"
            )
        cell = check_cell(entry[0], entry[1])
        low, high = check_ts("low_ts", entry[2]), check_ts("high_ts", entry[3])
        if low > high:
            raise ValueError(f"low_ts {low} is above high_ts {high} in a version range")
        out.append((cell, low, high))
    return out


def check_stamps(stamps: Iterable[VersionStamp]) -> list[VersionStamp]:
    """Validate a batch of commit stamps before any I/O: a stamp is above its version."""
    out = []
    for s in stamps:
        if not isinstance(s, VersionStamp):
            raise TypeError(f"expected VersionStamp, got {type(s).__name__}")
        check_cell(s.row, s.column)
        check_ts("ts", s.ts)
        check_ts("commit_ts", s.commit_ts)
        if s.commit_ts <= s.ts:
            raise ValueError(
                f"commit_ts {s.commit_ts} of version {s.ts} must be above the version's ts"
            )
        out.append(s)
    return out


def clamp_scan_bounds(
    start_row: bytes,
    start_column: bytes,
    end_row: bytes | None,
    *,
    max_cell_key: int = MAX_CELL_KEY_BYTES,
) -> tuple[bytes, bytes, bytes | None]:
    """Scan bounds no longer than a stored key needs, selecting exactly the same cells.

    For a backend whose requests must stay small (a Cassandra request holds at most
    16 MiB, and a scan sends its bounds once per shard and page). A stored row has at
    most ``L = max_cell_key - 1`` bytes, so it is never equal to a longer bound, and
    comparing it with a bound looks at no more than the bound's first ``L + 1`` bytes:
    ``row < end_row`` exactly when ``row < end_row[:L + 1]``. The same holds for the
    ``(start_row, start_column)`` cursor: a start row longer than ``L`` admits exactly
    the rows above it, so it becomes ``(start_row[:L + 1], b"")``; a start column
    longer than its row leaves room for (``max_cell_key - len(start_row)`` bytes) is cut
    to one byte more than that.
    """
    longest_row = max_cell_key - 1
    if end_row is not None and len(end_row) > longest_row + 1:
        end_row = end_row[: longest_row + 1]
    if len(start_row) > longest_row:
        start_row, start_column = start_row[: longest_row + 1], b""
    else:
        longest_column = max_cell_key - len(start_row)
        if len(start_column) > longest_column + 1:
            start_column = start_column[: longest_column + 1]
    return start_row, start_column, end_row


class KVStore(abc.ABC):
    """A multi-version key-value store, batched everywhere.

    Implementations are safe to share between threads. Every method validates
    its arguments before any I/O and raises ``TypeError``/``ValueError`` naming
    the problem, sizes included (the limits of the module docstring, the same on
    every backend). Tables need no DDL: any valid table name can be used at any time.

    A version's life, which every backend supports and callers keep to: it is
    written (possibly more than once, always with the same value), and then perhaps
    deleted; once deleted it is never written again. The transaction layer keeps to
    it: a version ``(table, row, column, start_ts)`` is written only by the
    transaction that started at ``start_ts``, in one :meth:`put_versions` call before
    its commit point, and deleted only after that transaction was settled ABORTED,
    by a cleaner that found the version or by the transaction itself after its put
    returned. Writing a version with another value, or again after a delete, is
    outside the contract: backends differ (memory and SQLite apply calls in call
    order; Cassandra orders writes of one version by the clients' clocks, which
    nothing synchronises).
    """

    # --- versioned cells -------------------------------------------------------

    @abc.abstractmethod
    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        """Write versions of cells.

        Idempotent: writing a version ``(row, column, ts)`` again with the value it
        has changes nothing (a tombstone ``None`` is a value here), so a write whose
        outcome is unknown may be re-issued. Rewriting a version with a different
        value, or after :meth:`delete_versions` removed it, is outside the contract
        (see the class docstring): callers never do it. Within one call, a version
        listed twice keeps its last value. Not atomic across versions: after a
        failure any subset may have been written, which the transaction protocol
        tolerates (rule S2). Limits: row + column at most ``MAX_CELL_KEY_BYTES``,
        value at most ``MAX_VALUE_BYTES``.
        """

    def put_versions_of_tables(self, writes: Sequence[tuple[str, Sequence[VersionWrite]]]) -> None:
        """:meth:`put_versions` of each ``(table, versions)``, in one call.

        The same contract as one ``put_versions`` per table (idempotent; not atomic,
        across versions or tables: after a failure any subset may have been written).
        A store whose requests overlap sends every table's writes together, one round
        instead of one per table (a transaction's write step); this generic version
        writes the tables one after another.
        """
        for table, versions in writes:
            self.put_versions(table, versions)

    @abc.abstractmethod
    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        """For each cell, its newest version with ``ts < below_ts``.

        Cells with no such version are left out of the result. Tombstones are
        returned (``value=None``): visibility is the transaction layer's call. A
        cell no backend can store (``MAX_CELL_KEY_BYTES``) is refused.
        """

    def get_latest_of_tables(
        self, reads: Sequence[tuple[str, Sequence[tuple[bytes, bytes]]]], below_ts: int
    ) -> list[dict[Cell, Version]]:
        """:meth:`get_latest` of each ``(table, cells)`` below ``below_ts``, in one call:
        the results in the order of ``reads``.

        The same contract as one ``get_latest`` per table. A store whose requests
        overlap reads every table together, one round instead of one per table (what a
        group commit reads before it writes: the table's head and its job marks); this
        generic version reads the tables one after another.
        """
        return [self.get_latest(table, cells, below_ts) for table, cells in reads]

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
        Backends fetch ``page_size`` cells at a time (any positive int; at most
        ``MAX_PAGE_SIZE`` per request); the iterator is lazy and not a consistent
        snapshot of concurrent writes at or above ``below_ts``. The bounds may be
        of any length: they are compared with stored keys, never stored.

        The arguments are checked here, when ``scan`` is called rather than when the
        iterator is first advanced, so every backend refuses a bad scan alike; the
        backend's :meth:`_scan` does the reading.
        """
        page_size = check_scan(table, start_row, end_row, below_ts, start_column, page_size)
        return self._scan(table, start_row, end_row, below_ts, start_column, page_size)

    @abc.abstractmethod
    def _scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        """:meth:`scan` with its arguments checked and ``page_size`` at most
        ``MAX_PAGE_SIZE``: the backend's reading, lazy like the iterator it returns."""

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
        left out. Used by write-write conflict checks. The bounds may be any ``int``
        (not ``bool``), inside the stored range ``[0, MAX_TIMESTAMP]`` or not, and the
        interval is exact on every backend: ``below_ts=MAX_TIMESTAMP + 1`` finds a
        version at ``MAX_TIMESTAMP``, which no read below a timestamp reaches.
        """

    def get_version_timestamps_of_tables(
        self,
        reads: Sequence[tuple[str, Sequence[tuple[bytes, bytes]]]],
        *,
        limit: int | None = None,
    ) -> list[dict[Cell, list[int]]]:
        """:meth:`get_version_timestamps` of each ``(table, cells)`` with ``limit``, in
        one call: the results in the order of ``reads``.

        A store whose requests overlap reads every table together, one round instead
        of one per table (a transaction's conflict check); this generic version reads
        the tables one after another.
        """
        return [self.get_version_timestamps(table, cells, limit=limit) for table, cells in reads]

    def put_versions_read_back_of_tables(
        self,
        writes: Sequence[tuple[str, Sequence[VersionWrite]]],
        *,
        limit: int | None = None,
    ) -> list[dict[Cell, list[int]]]:
        """:meth:`put_versions_of_tables` of ``writes``, then
        :meth:`get_version_timestamps_of_tables` of the cells written, with ``limit``:
        the results in the order of ``writes``.

        The read of a cell begins only after every version of it in ``writes`` was
        written (as :meth:`put_versions` writes: a later read by anyone sees it), so
        it sees those versions and every other version of the cell written before
        they landed: what a transaction's conflict check needs (rule S2). Nothing
        orders the read of one cell after the writes of another. A store whose
        requests overlap reads each cell back as soon as its own writes landed, in the
        same round as the writes; this generic version writes every table, then reads
        them. After a failure any subset may have been written, as for
        :meth:`put_versions_of_tables`; bad input is refused before anything is written.
        """
        checked = [(check_table(t), check_writes(vs)) for t, vs in writes]
        check_limit(limit)
        self.put_versions_of_tables(checked)
        cells = [(t, list(dict.fromkeys((v.row, v.column) for v in vs))) for t, vs in checked]
        return self.get_version_timestamps_of_tables(cells, limit=limit)

    @abc.abstractmethod
    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        """Remove versions ``(row, column, ts)``; missing ones are ignored (idempotent).

        A version deleted stays deleted, on every backend and whatever the clients'
        clocks, against every write of it that completed or could be read before the
        delete was called, and against a late copy of such a write (a resent
        request, a replayed hint): Cassandra deletes above the version's write time,
        not at the deleting client's clock. Callers never write a version again after
        deleting it (class docstring); the transaction layer deletes only versions of
        transactions settled ABORTED, which are invisible whatever the delete does.
        """

    def delete_version_ranges(
        self, table: str, ranges: Sequence[tuple[bytes, bytes, int, int]]
    ) -> int:
        """Remove every version of cell ``(row, column)`` with ``low_ts <= ts <= high_ts``,
        for each ``(row, column, low_ts, high_ts)``; returns how many versions the
        ranges held when read (a backend that deletes without reading counts what it
        read for the delete's timestamp, see Cassandra).

        For garbage collection below the safe point (rule S8): a version written into
        a range while the call runs, or later, may be removed too (on Cassandra a range
        is one range tombstone, above the write times of the versions it found, which
        also covers a later write with a lagging clock). So callers use it only where
        no version a reader needs can be written any more: below a published safe point,
        after its grace. Otherwise as :meth:`delete_versions`: idempotent, stamps go
        with their versions, and a removed version stays removed.

        This default reads the timestamps in each range (one read per distinct range)
        and deletes them one by one; a backend that deletes a range in place (SQLite,
        Cassandra) overrides it.
        """
        check_table(table)
        wanted = check_ranges(ranges)
        by_bounds: dict[tuple[int, int], list[Cell]] = {}
        doomed: list[tuple[bytes, bytes, int]] = []
        for cell, low, high in wanted:
            by_bounds.setdefault((low, high), []).append(cell)
        for (low, high), cells in by_bounds.items():
            found = self.get_version_timestamps(table, cells, above_ts=low - 1, below_ts=high + 1)
            doomed += [(cell.row, cell.column, ts) for cell, tss in found.items() for ts in tss]
        doomed = list(dict.fromkeys(doomed))
        self.delete_versions(table, doomed)
        return len(doomed)

    def prune_cells(self, table: str, below_ts: int) -> int:
        """Let scans forget the cells of ``table`` that hold no version at all; returns
        how many were forgotten.

        Scans through an index kept apart from the versions (Cassandra's ``cells``) read
        an entry for every cell ever written; this drops those of cells with no version
        left. It never hides a version at or above ``below_ts``, whenever it is written
        (before, during or after the call), nor one that exists when the call reads it.

        The caller guarantees that no version below ``below_ts`` that a reader needs is
        written after the call begins: garbage collection passes its published safe
        point, after the grace (rule S8: a writer below it never reaches its commit
        point). A version below ``below_ts`` written while or after the call runs may
        be left out of scans (never out of :meth:`get_latest` or the other reads of
        named cells) until a version at or above ``below_ts`` is written to its cell.

        This default does nothing: memory and SQLite find cells through their versions,
        so a cell without one costs their scans nothing.
        """
        check_table(table)
        check_ts("below_ts", below_ts)
        return 0

    def prune_emptied_cells(self, table: str, below_ts: int, cells: Sequence[Cell]) -> int:
        """:meth:`prune_cells` where ``cells`` are (the cells a garbage-collection pass
        just left without a version): the same guarantees, the same caller's promise,
        at the cost of what lies near those cells instead of the whole table. It may
        forget fewer cells than :meth:`prune_cells` (the rest go at the next one), and
        never one that holds a version, named or not.

        This default does nothing, as :meth:`prune_cells`.
        """
        check_table(table)
        check_ts("below_ts", below_ts)
        check_cells(cells)
        return 0

    @abc.abstractmethod
    def get_versions(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[Version]]:
        """For each cell, its versions with ``ts < below_ts``, values and commit stamps
        included, newest first, at most ``limit`` per cell. Cells without such versions
        are left out. Used by garbage collection, which decides per version.
        """

    def sweep_candidates(
        self,
        table: str,
        below_ts: int,
        stamped_below: int,
        *,
        start_row: bytes = b"",
        start_column: bytes = b"",
        page_size: int = 1000,
    ) -> Iterator[Cell]:
        """Cells of ``table`` from ``(start_row, start_column)`` on, in ``(row, column)``
        order, that garbage collection may have work on below ``below_ts``: each cell
        with a version below ``below_ts``, except a cell whose one version below it
        carries a commit stamp below ``stamped_below`` and a value (nothing to delete,
        stamp or collect there). More cells than that is correct, fewer is not.

        This default yields every cell :meth:`scan` finds below ``below_ts``; a backend
        that can filter where the data is (SQLite's ``GROUP BY ... HAVING``) overrides
        it, so that a pass over a store of mostly settled cells reads only the few it
        has work on instead of bringing every cell to Python.
        """
        check_ts("stamped_below", stamped_below)
        for entry in self.scan(
            table, start_row, None, below_ts, start_column=start_column, page_size=page_size
        ):
            yield Cell(entry.row, entry.column)

    @abc.abstractmethod
    def stamp_versions(self, table: str, stamps: Sequence[VersionStamp]) -> None:
        """Write each version's commit stamp (rule S9); reads return it as ``commit_ts``.

        Idempotent, and a stamp is only ever written with the one commit timestamp its
        writer has. A version that does not exist (never written, or deleted, also
        concurrently) is left absent: a stamp never creates a version or brings a
        deleted one back, on any backend and whatever the clients' clocks. Rewriting a
        stamped version with its same value keeps the stamp.
        """

    @abc.abstractmethod
    def tables(self) -> list[str]:
        """The names of the tables that hold, or once held, versions; sorted."""

    # --- system rows -----------------------------------------------------------

    @abc.abstractmethod
    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        """Insert ``key -> value`` only if ``key`` has no value: linearizable (rule S1).

        Returns ``CasResult(True, value)`` when this call wrote it, else
        ``CasResult(False, existing)``. Re-issuing the same call after an unknown
        outcome is safe: finding ``existing == value`` means an earlier attempt won.
        Raises :class:`StoreTimeoutError` when the outcome is unknown. Limits: table
        name + key at most ``MAX_SYSTEM_KEY_BYTES``, value at most
        ``MAX_SYSTEM_VALUE_BYTES`` (also for ``compare_and_set``'s ``expected``).
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

    @abc.abstractmethod
    def delete_system(self, table: str, key: bytes, expected: bytes) -> CasResult:
        """Delete ``key`` only if its value is ``expected``: linearizable, like
        :meth:`compare_and_set`. Returns ``CasResult(True, None)`` when this call deleted
        it, else ``CasResult(False, current)`` (``current`` is ``None`` when the row was
        already absent). A ``put_unless_exists`` of the key afterwards applies again.
        Raises :class:`StoreTimeoutError` when the outcome is unknown.
        """

    def get_system_final(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """:meth:`get_system` of rows written once, then at most deleted (the
        transactions table), with the same answer. Cassandra reads one replica and
        SERIAL only the keys not found there (docs/design/storage.md, "Reads of final
        rows"); this default is :meth:`get_system`."""
        return self.get_system(table, keys)

    def delete_system_many(self, table: str, rows: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """:meth:`delete_system` of each ``(key, expected)`` (all checked first; no key
        twice), each as if at some point of the call: whether each was deleted. A later
        write of the key is never deleted (docs/design/storage.md, "Deleting final rows")."""
        check_system_deletes(table, rows)
        return [self.delete_system(table, key, expected).applied for key, expected in rows]

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
