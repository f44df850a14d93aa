"""The embedded default backend: ``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

One SQLite file in WAL mode. A single connection guarded by a lock serves every
thread of the process; SQLite serialises writers anyway, and one connection keeps
put-unless-exists and compare-and-set trivially linearizable. ``synchronous=FULL``
by default so that an acknowledged commit survives power loss, not only a crash;
``?synchronous=normal`` trades that for speed. ``?busy_timeout_ms=N`` (default
30,000) bounds how long a write waits for another process's write lock.

Every ``sqlite3`` error leaves as a :class:`StoreError` (see :func:`_store_error`), with
the connection's transaction rolled back and the adapter's lock released. Claims
(:meth:`SQLiteStore.claim`) are OS locks on the database file itself, so every path to
it (a symlink, a hard link) meets the same claim.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from storage_adapters._base import (
    MAX_TIMESTAMP,
    CasResult,
    Cell,
    Claim,
    ScanEntry,
    Version,
    VersionStamp,
    VersionWrite,
    check_cells,
    check_deletes,
    check_limit,
    check_ranges,
    check_scan,
    check_stamps,
    check_system_deletes,
    check_system_key,
    check_system_write,
    check_table,
    check_ts,
    check_writes,
)
from storage_adapters._sqlite_claims import SQLiteClaims
from wire.errors import StoreError, StoreTimeoutError, StoreUnavailableError

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    tbl TEXT NOT NULL, row BLOB NOT NULL, col BLOB NOT NULL, ts INTEGER NOT NULL, value BLOB,
    commit_ts INTEGER,
    PRIMARY KEY (tbl, row, col, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS system_rows (
    tbl TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (tbl, key)
) WITHOUT ROWID;
"""

_SYNC_MODES = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}
#: SQLite integers are signed 64-bit: a LIMIT above this is "no limit" anyway.
_SQL_INT_MAX = (1 << 63) - 1
#: How long a write waits for another connection's write lock before "database is locked".
DEFAULT_BUSY_TIMEOUT_MS = 30_000

# Bare columns next to max() take their values from the row holding the maximum: a
# documented SQLite rule that gives "newest version per cell" in one indexed pass.
_SCAN_SQL = """
SELECT row, col, max(ts), value, commit_ts FROM versions
WHERE tbl = ? AND (row, col) {op} (?, ?) AND ts < ? {end}
GROUP BY row, col ORDER BY row, col LIMIT ?
"""

#: Cells garbage collection has work on (:meth:`KVStore.sweep_candidates`): more than
#: one version below the safe point, or one without a stamp, a delete, or a stamp at
#: or above ``stamped_below`` (its entry not collected yet).
_SWEEP_SQL = """
SELECT row, col FROM versions
WHERE tbl = ? AND (row, col) {op} (?, ?) AND ts < ?
GROUP BY row, col
HAVING count(*) > 1 OR max(commit_ts IS NULL) OR max(value IS NULL) OR max(commit_ts) >= ?
ORDER BY row, col LIMIT ?
"""


class SQLiteOptions(NamedTuple):
    path: str
    synchronous: str
    busy_timeout_ms: int


def parse_sqlite_url(url: str) -> SQLiteOptions:
    """The database path and options of a ``sqlite:///...`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ValueError(f"not a sqlite URL: {url!r}")
    if parts.netloc:
        raise ValueError(
            f"invalid sqlite URL {url!r}: expected sqlite:///relative/path.db or "
            f"sqlite:////absolute/path.db (found host {parts.netloc!r})"
        )
    path = parts.path[1:]
    if not path or path.endswith("/"):
        raise ValueError(f"invalid sqlite URL {url!r}: no database file path")
    options = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(options) - {"synchronous", "busy_timeout_ms"}
    if unknown:
        raise ValueError(f"invalid sqlite URL {url!r}: unknown option(s) {sorted(unknown)}")
    sync = options.get("synchronous", ["full"])[-1].lower()
    if sync not in _SYNC_MODES:
        raise ValueError(
            f"invalid sqlite URL {url!r}: synchronous must be one of {sorted(_SYNC_MODES)}"
        )
    busy = options.get("busy_timeout_ms", [str(DEFAULT_BUSY_TIMEOUT_MS)])[-1]
    if not busy.isdigit():
        raise ValueError(
            f"invalid sqlite URL {url!r}: busy_timeout_ms must be a non-negative integer"
        )
    return SQLiteOptions(path, _SYNC_MODES[sync], int(busy))


# Which StoreError a sqlite3 error becomes. A statement that fails is rolled back by
# SQLite (and an explicit transaction by us), so a failed write normally changed
# nothing: StoreError, or StoreUnavailableError when another connection held the lock
# (SQLITE_BUSY/SQLITE_LOCKED: the write never started). The exception is an I/O error
# during a write: the WAL frames of the commit may have reached the file before the
# error, and WAL recovery replays complete frames, so the write may surface later.
# That is an unknown outcome, which callers settle by re-reading (StoreTimeoutError).
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def _store_error(exc: sqlite3.Error, path: str, *, writes: bool) -> StoreError:
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF  # extended codes keep it in the low byte
    message = f"sqlite {path}: {exc}"
    if primary in _BUSY_CODES:
        return StoreUnavailableError(message)
    if writes and primary == sqlite3.SQLITE_IOERR:
        return StoreTimeoutError(f"{message} (the write may or may not have been applied)")
    return StoreError(message)


class SQLiteStore(SQLiteClaims):
    """:class:`KVStore` on one SQLite file; its claims are
    :class:`~storage_adapters._sqlite_claims.SQLiteClaims`."""

    def __init__(self, url: str) -> None:
        path, sync, busy_timeout_ms = parse_sqlite_url(url)
        self._url = url
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._lock = threading.Lock()
        self._claims: dict[str, Claim] = {}
        #: The database file itself, resolved now (a later chdir must not move it), and
        #: the descriptor that holds the claims' locks on it, opened by the first claim.
        self._real_path = os.path.realpath(path)
        self._claim_fd: int | None = None
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _store_error(exc, path, writes=False) from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={sync}")
            self._conn.executescript(_SCHEMA)
            columns = {r[1] for r in self._conn.execute("PRAGMA table_info(versions)")}
            if "commit_ts" not in columns:  # a store written before commit stamps (S9)
                self._conn.execute("ALTER TABLE versions ADD COLUMN commit_ts INTEGER")
        except sqlite3.Error as exc:
            self._conn.close()
            raise _store_error(exc, path, writes=True) from exc
        self._closed = False

    @contextlib.contextmanager
    def _using(self, *, writes: bool) -> Iterator[sqlite3.Cursor]:
        """The connection's cursor under the adapter's lock; sqlite3 errors become StoreErrors."""
        with self._lock:
            if self._closed:
                raise ValueError("store is closed")
            try:
                yield self._conn.cursor()
            except sqlite3.Error as exc:
                self._rollback()
                raise _store_error(exc, self.path, writes=writes) from exc
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        # SQLite rolls some failures back itself (then there is nothing left to roll
        # back); a busy COMMIT leaves the transaction open, and ours must not linger.
        if not self._conn.in_transaction:
            return
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("sqlite %s: rollback after a failure failed too: %s", self.path, exc)

    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        check_table(table)
        writes = check_writes(versions)
        if not writes:
            return
        rows = [(table, v.row, v.column, v.ts, v.value) for v in writes]
        with self._using(writes=True) as cur:
            cur.execute("BEGIN")
            cur.executemany(
                # An upsert, not INSERT OR REPLACE: rewriting a version keeps its stamp.
                "INSERT INTO versions (tbl, row, col, ts, value) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (tbl, row, col, ts) DO UPDATE SET value = excluded.value",
                rows,
            )
            cur.execute("COMMIT")

    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        out: dict[Cell, Version] = {}
        with self._using(writes=False) as cur:
            for cell in wanted:
                found = cur.execute(
                    "SELECT ts, value, commit_ts FROM versions WHERE tbl = ? AND row = ? "
                    "AND col = ? AND ts < ? ORDER BY ts DESC LIMIT 1",
                    (table, cell.row, cell.column, below_ts),
                ).fetchone()
                if found is not None:
                    out[cell] = Version(found[0], found[1], found[2])
        return out

    def _scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        end = "" if end_row is None else "AND row < ?"
        bounded = () if end_row is None else (end_row,)
        for row, col, ts, value, commit_ts in self._cell_pages(
            lambda op: _SCAN_SQL.format(op=op, end=end),
            lambda r, c: (table, r, c, below_ts, *bounded, page_size),
            (start_row, start_column),
            page_size,
        ):
            yield ScanEntry(row, col, ts, value, commit_ts)

    def _cell_pages(
        self,
        sql: Callable[[str], str],
        params: Callable[[bytes, bytes], tuple[object, ...]],
        start: tuple[bytes, bytes],
        page_size: int,
    ) -> Iterator[tuple[Any, ...]]:
        """Rows of a query over cells in ``(row, col)`` order, a page at a time: the
        first page from ``start`` on (``sql(">=")``), each next one after the last
        cell of the one before (``sql(">")``); ``params(row, col)`` binds the cursor."""
        (cursor_row, cursor_col), op = start, ">="
        while True:
            with self._using(writes=False) as cur:
                page = cur.execute(sql(op), params(cursor_row, cursor_col)).fetchall()
            yield from page
            if len(page) < page_size:
                return
            cursor_row, cursor_col, op = page[-1][0], page[-1][1], ">"

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
        page_size = check_scan(table, start_row, None, below_ts, start_column, page_size)
        check_ts("stamped_below", stamped_below)
        return self._sweep_candidates(
            table, below_ts, stamped_below, start_row, start_column, page_size
        )

    def _sweep_candidates(
        self,
        table: str,
        below_ts: int,
        stamped_below: int,
        start_row: bytes,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[Cell]:
        for row, col in self._cell_pages(
            lambda op: _SWEEP_SQL.format(op=op),
            lambda r, c: (table, r, c, below_ts, stamped_below, page_size),
            (start_row, start_column),
            page_size,
        ):
            yield Cell(row, col)

    def get_version_timestamps(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        above_ts: int = -1,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[int]]:
        check_table(table)
        wanted = check_cells(cells)
        for name, bound in (("above_ts", above_ts), ("below_ts", below_ts)):
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise TypeError(f"{name} must be int, got {type(bound).__name__}")
        limit = check_limit(limit)
        # Any int is a bound. Stored timestamps lie in [0, MAX_TIMESTAMP], so clamping
        # to that range changes no match and keeps the parameters in SQLite's int64;
        # the upper bound goes inclusive (ts <= below_ts - 1) so that below_ts=2**63
        # still finds a version at MAX_TIMESTAMP.
        above = min(max(above_ts, -1), MAX_TIMESTAMP)
        last = min(max(below_ts - 1, -1), MAX_TIMESTAMP)
        out: dict[Cell, list[int]] = {}
        with self._using(writes=False) as cur:
            if last <= above:  # an empty interval (after the closed-store check)
                return out
            for cell in wanted:
                tss = [
                    r[0]
                    for r in cur.execute(
                        "SELECT ts FROM versions WHERE tbl = ? AND row = ? AND col = ? "
                        "AND ts > ? AND ts <= ? ORDER BY ts DESC LIMIT ?",
                        (
                            table,
                            cell.row,
                            cell.column,
                            above,
                            last,
                            -1 if limit is None else min(limit, _SQL_INT_MAX),
                        ),
                    )
                ]
                if tss:
                    out[cell] = tss
        return out

    def get_versions(
        self,
        table: str,
        cells: Sequence[tuple[bytes, bytes]],
        *,
        below_ts: int = MAX_TIMESTAMP,
        limit: int | None = None,
    ) -> dict[Cell, list[Version]]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        limit = check_limit(limit)
        out: dict[Cell, list[Version]] = {}
        with self._using(writes=False) as cur:
            for cell in wanted:
                found = [
                    Version(ts, value, commit_ts)
                    for ts, value, commit_ts in cur.execute(
                        "SELECT ts, value, commit_ts FROM versions WHERE tbl = ? AND row = ? "
                        "AND col = ? AND ts < ? ORDER BY ts DESC LIMIT ?",
                        (
                            table,
                            cell.row,
                            cell.column,
                            below_ts,
                            -1 if limit is None else min(limit, _SQL_INT_MAX),
                        ),
                    )
                ]
                if found:
                    out[cell] = found
        return out

    def stamp_versions(self, table: str, stamps: Sequence[VersionStamp]) -> None:
        check_table(table)
        rows = [(s.commit_ts, table, s.row, s.column, s.ts) for s in check_stamps(stamps)]
        if not rows:
            return
        with self._using(writes=True) as cur:
            cur.execute("BEGIN")
            cur.executemany(
                "UPDATE versions SET commit_ts = ? WHERE tbl = ? AND row = ? AND col = ? "
                "AND ts = ?",
                rows,
            )
            cur.execute("COMMIT")

    def tables(self) -> list[str]:
        with self._using(writes=False) as cur:
            # A skip-scan of the primary key: one probe per table, not per version.
            names: list[str] = []
            found = cur.execute("SELECT min(tbl) FROM versions").fetchone()
            while found is not None and found[0] is not None:
                names.append(found[0])
                found = cur.execute(
                    "SELECT min(tbl) FROM versions WHERE tbl > ?", (found[0],)
                ).fetchone()
            return names

    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        check_table(table)
        doomed = [(table, cell.row, cell.column, ts) for cell, ts in check_deletes(versions)]
        if not doomed:
            return
        with self._using(writes=True) as cur:
            cur.execute("BEGIN")
            cur.executemany(
                "DELETE FROM versions WHERE tbl = ? AND row = ? AND col = ? AND ts = ?", doomed
            )
            cur.execute("COMMIT")

    def delete_version_ranges(
        self, table: str, ranges: Sequence[tuple[bytes, bytes, int, int]]
    ) -> int:
        """One ``DELETE ... ts BETWEEN`` per range over the primary key, in one
        transaction: the rows go where they are, none comes to Python."""
        check_table(table)
        wanted = [(table, c.row, c.column, low, high) for c, low, high in check_ranges(ranges)]
        if not wanted:
            return 0
        with self._using(writes=True) as cur:
            cur.execute("BEGIN")
            deleted = 0
            for params in wanted:
                cur.execute(
                    "DELETE FROM versions WHERE tbl = ? AND row = ? AND col = ? "
                    "AND ts BETWEEN ? AND ?",
                    params,
                )
                deleted += max(cur.rowcount, 0)
            cur.execute("COMMIT")
        return deleted

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        check_system_write(table, key, value)
        with self._using(writes=True) as cur:
            cur.execute(
                "INSERT INTO system_rows (tbl, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (tbl, key) DO NOTHING",
                (table, key, value),
            )
            if cur.rowcount == 1:
                return CasResult(True, value)
            existing = cur.execute(
                "SELECT value FROM system_rows WHERE tbl = ? AND key = ?", (table, key)
            ).fetchone()
            return CasResult(False, existing[0])

    def compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> CasResult:
        check_system_write(table, key, value, expected=expected)
        if expected is None:
            return self.put_unless_exists(table, key, value)
        with self._using(writes=True) as cur:
            cur.execute(
                "UPDATE system_rows SET value = ? WHERE tbl = ? AND key = ? AND value = ?",
                (value, table, key, expected),
            )
            if cur.rowcount == 1:
                return CasResult(True, value)
            current = cur.execute(
                "SELECT value FROM system_rows WHERE tbl = ? AND key = ?", (table, key)
            ).fetchone()
            return CasResult(False, None if current is None else current[0])

    def get_system(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        check_table(table)
        wanted = [check_system_key(table, k) for k in keys]
        out: dict[bytes, bytes] = {}
        with self._using(writes=False) as cur:
            for key in wanted:
                found = cur.execute(
                    "SELECT value FROM system_rows WHERE tbl = ? AND key = ?", (table, key)
                ).fetchone()
                if found is not None:
                    out[key] = found[0]
        return out

    def delete_system(self, table: str, key: bytes, expected: bytes) -> CasResult:
        check_system_write(table, key, expected)
        with self._using(writes=True) as cur:
            cur.execute("BEGIN IMMEDIATE")
            deleted = cur.execute(
                "DELETE FROM system_rows WHERE tbl = ? AND key = ? AND value = ?",
                (table, key, expected),
            ).rowcount
            current = None
            if not deleted:
                found = cur.execute(
                    "SELECT value FROM system_rows WHERE tbl = ? AND key = ?", (table, key)
                ).fetchone()
                current = None if found is None else found[0]
            cur.execute("COMMIT")
        return CasResult(bool(deleted), current)

    def delete_system_many(self, table: str, rows: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """One transaction for all of them (one fsync, not one a row): atomic here."""
        check_system_deletes(table, rows)
        with self._using(writes=True) as cur:
            cur.execute("BEGIN IMMEDIATE")
            deleted = [
                cur.execute(
                    "DELETE FROM system_rows WHERE tbl = ? AND key = ? AND value = ?",
                    (table, key, expected),
                ).rowcount
                == 1
                for key, expected in rows
            ]
            cur.execute("COMMIT")
        return deleted

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
        # After the connection: closing any descriptor of the database file drops the
        # process's POSIX locks on it, SQLite's own included.
        self._release_claims()
