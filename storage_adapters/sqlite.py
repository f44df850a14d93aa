"""The embedded default backend: ``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

One SQLite file in WAL mode. A single connection guarded by a lock serves every
thread of the process; SQLite serialises writers anyway, and one connection keeps
put-unless-exists and compare-and-set trivially linearizable. ``synchronous=FULL``
by default so that an acknowledged commit survives power loss, not only a crash;
``?synchronous=normal`` trades that for speed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from urllib.parse import parse_qs, urlsplit

from storage_adapters._base import (
    MAX_TIMESTAMP,
    CasResult,
    Cell,
    KVStore,
    ScanEntry,
    Version,
    VersionWrite,
    check_cells,
    check_key,
    check_scan,
    check_table,
    check_ts,
    check_value,
    check_writes,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    tbl TEXT NOT NULL, row BLOB NOT NULL, col BLOB NOT NULL, ts INTEGER NOT NULL, value BLOB,
    PRIMARY KEY (tbl, row, col, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS system_rows (
    tbl TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (tbl, key)
) WITHOUT ROWID;
"""

_SYNC_MODES = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}

# Bare columns next to max() take their values from the row holding the maximum: a
# documented SQLite rule that gives "newest version per cell" in one indexed pass.
_SCAN_SQL = """
SELECT row, col, max(ts), value FROM versions
WHERE tbl = ? AND (row, col) {op} (?, ?) AND ts < ? {end}
GROUP BY row, col ORDER BY row, col LIMIT ?
"""


def parse_sqlite_url(url: str) -> tuple[str, str]:
    """Return ``(path, synchronous_mode)`` for a ``sqlite:///...`` URL."""
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
    unknown = set(options) - {"synchronous"}
    if unknown:
        raise ValueError(f"invalid sqlite URL {url!r}: unknown option(s) {sorted(unknown)}")
    sync = options.get("synchronous", ["full"])[-1].lower()
    if sync not in _SYNC_MODES:
        raise ValueError(
            f"invalid sqlite URL {url!r}: synchronous must be one of {sorted(_SYNC_MODES)}"
        )
    return path, _SYNC_MODES[sync]


class SQLiteStore(KVStore):
    """:class:`KVStore` on one SQLite file."""

    def __init__(self, url: str) -> None:
        path, sync = parse_sqlite_url(url)
        self._url = url
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={sync}")
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._conn.executescript(_SCHEMA)
        self._closed = False

    def _cursor(self) -> sqlite3.Cursor:
        if self._closed:
            raise ValueError("store is closed")
        return self._conn.cursor()

    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        check_table(table)
        writes = check_writes(versions)
        if not writes:
            return
        rows = [(table, v.row, v.column, v.ts, v.value) for v in writes]
        with self._lock:
            cur = self._cursor()
            cur.execute("BEGIN")
            try:
                cur.executemany(
                    "INSERT OR REPLACE INTO versions (tbl, row, col, ts, value) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        check_table(table)
        wanted = check_cells(cells)
        check_ts("below_ts", below_ts)
        out: dict[Cell, Version] = {}
        with self._lock:
            cur = self._cursor()
            for cell in wanted:
                found = cur.execute(
                    "SELECT ts, value FROM versions WHERE tbl = ? AND row = ? AND col = ? "
                    "AND ts < ? ORDER BY ts DESC LIMIT 1",
                    (table, cell.row, cell.column, below_ts),
                ).fetchone()
                if found is not None:
                    out[cell] = Version(found[0], found[1])
        return out

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
        check_scan(table, start_row, end_row, below_ts, start_column, page_size)
        return self._scan(table, start_row, end_row, below_ts, start_column, page_size)

    def _scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        cursor_row, cursor_col, op = start_row, start_column, ">="
        while True:
            sql = _SCAN_SQL.format(op=op, end="" if end_row is None else "AND row < ?")
            params: list[object] = [table, cursor_row, cursor_col, below_ts]
            if end_row is not None:
                params.append(end_row)
            params.append(page_size)
            with self._lock:
                page = self._cursor().execute(sql, params).fetchall()
            for row, col, ts, value in page:
                yield ScanEntry(row, col, ts, value)
            if len(page) < page_size:
                return
            cursor_row, cursor_col, op = page[-1][0], page[-1][1], ">"

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
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be positive, got {limit}")
        out: dict[Cell, list[int]] = {}
        with self._lock:
            cur = self._cursor()
            for cell in wanted:
                tss = [
                    r[0]
                    for r in cur.execute(
                        "SELECT ts FROM versions WHERE tbl = ? AND row = ? AND col = ? "
                        "AND ts > ? AND ts < ? ORDER BY ts DESC LIMIT ?",
                        (
                            table,
                            cell.row,
                            cell.column,
                            above_ts,
                            below_ts,
                            -1 if limit is None else limit,
                        ),
                    )
                ]
                if tss:
                    out[cell] = tss
        return out

    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        check_table(table)
        doomed = [
            (table, check_key("row", r), check_key("column", c), check_ts("ts", ts))
            for r, c, ts in versions
        ]
        if not doomed:
            return
        with self._lock:
            cur = self._cursor()
            cur.execute("BEGIN")
            try:
                cur.executemany(
                    "DELETE FROM versions WHERE tbl = ? AND row = ? AND col = ? AND ts = ?", doomed
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        check_table(table)
        check_key("key", key)
        check_value(value)
        with self._lock:
            cur = self._cursor()
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
        check_table(table)
        check_key("key", key)
        if expected is not None:
            check_value(expected)
        check_value(value)
        if expected is None:
            return self.put_unless_exists(table, key, value)
        with self._lock:
            cur = self._cursor()
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
        wanted = [check_key("key", k) for k in keys]
        out: dict[bytes, bytes] = {}
        with self._lock:
            cur = self._cursor()
            for key in wanted:
                found = cur.execute(
                    "SELECT value FROM system_rows WHERE tbl = ? AND key = ?", (table, key)
                ).fetchone()
                if found is not None:
                    out[key] = found[0]
        return out

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
