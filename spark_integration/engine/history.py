"""History and time travel: every version a table keeps, and which one was latest when.

Log times never decrease from one version to the next (every commit takes its
log time at or above the head's ``last_ms``), so time travel is a binary search of
the log; :meth:`History.version_at` explains how an answer stays the same for ever.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from spark_integration.engine.checkpoints import list_gen
from spark_integration.engine.errors import VersionNotFoundError
from spark_integration.engine.model import (
    DML_OPERATIONS,
    OVERWRITE,
    FileEntry,
    Generation,
    Head,
    Layout,
    LogRecord,
)
from spark_integration.engine.retention import read_expiry
from spark_integration.engine.table_access import TableAccess
from storage_adapters import Cell, KVStore
from txn import Transaction

#: Log records whose commit stamps history reads in one store call.
STAMP_LOOKUP_CELLS = 1_000


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    record: LogRecord
    commit_ts: int | None
    added: list[FileEntry]
    removed: list[FileEntry]


class History:
    """History and time travel of one catalog's tables.

    ``outcome_of`` and ``stamps`` are where history finds commit timestamps that were
    not recorded: the transactions table, then, once garbage collection deleted the
    entry, the commit stamp of the log record's version (rule S9 stamps it first).
    Only a manager with the store in this process has them (embedded, or a
    gateway's); without them such a version's commit_ts stays ``None``.
    """

    def __init__(
        self,
        tables: TableAccess,
        *,
        outcome_of: Callable[[int], int | None] | None,
        stamps: KVStore | None,
    ) -> None:
        self._tables = tables
        self._outcome_of = outcome_of
        self._stamps = stamps

    def version_at(self, name: str, timestamp_ms: int) -> int:
        """The version that was the table's latest at ``timestamp_ms`` (time travel).

        The answer is repeatable: once given for a time, it is the answer for that
        time for ever (until the version expires or is vacuumed away). Log times
        never decrease from one version to the next, since every commit writes the
        head and takes its log time at or above the head's ``last_ms``; so a version
        committed after this answer can only take a log time at or below
        ``timestamp_ms`` if the head's ``last_ms`` still was at or below it. In that
        case the answer is the latest version, and before giving it this raises the
        head's ``last_ms`` above ``timestamp_ms`` in a transaction of its own: a
        commit that took its log time earlier conflicts with it on the head and
        retries above; one that comes later reads the raised head. Commits order
        themselves on the head, not on anyone's clock, so clocks skewed between
        gateways change log times, never an answer. Otherwise (some version's log
        time is above ``timestamp_ms``) a binary search over the log reads about
        log2(versions) records and writes nothing.

        Raises :class:`VersionNotFoundError` for a time before the table was created
        or after now by this process's clock.
        """
        tables = self._tables
        if timestamp_ms > tables.clock_ms():
            raise VersionNotFoundError(
                f"timestamp {timestamp_ms} ms is in the future: table {name!r} has no "
                "version as of then yet"
            )
        with tables.tm.begin() as tx:
            head = tables.read_head(tx, name)
            if timestamp_ms < head.last_ms:
                return self._search_log(tx, name, head, timestamp_ms)

        def fence(tx: Transaction) -> int:
            head = tables.read_head(tx, name)
            if timestamp_ms < head.last_ms:  # a commit or another answer raised it
                return self._search_log(tx, name, head, timestamp_ms)
            raised = dataclasses.replace(head, last_ms=timestamp_ms + 1)
            tx.put(tables.layout.head, Layout.name_row(name), Layout.COL_HEAD, raised.encode())
            return head.version

        # The answer is given only once the raised head committed; an attempt whose
        # outcome is unknown is settled (fenced) and the question asked again.
        with tables.head_turn(name):
            version, _ = tables.transact(
                fence,
                what=f"time travel to {timestamp_ms} ms in table {name!r}",
                settle_unknown=True,
            )
        return version

    def _search_log(self, tx: Transaction, name: str, head: Head, timestamp_ms: int) -> int:
        """The newest version whose log time is at or below ``timestamp_ms``, at ``tx``'s
        snapshot (log times never decrease from one version to the next)."""
        layout = self._tables.layout

        def at(version: int) -> int:
            raw = tx.get(layout.log, Layout.log_row(name, version), Layout.COL_RECORD)
            if raw is None:
                raise VersionNotFoundError(f"table {name!r} has no log record of {version}")
            return LogRecord.decode(raw).timestamp_ms

        # Below the oldest readable version log records may have expired.
        lo, hi = head.min_readable_version, head.version
        if at(lo) > timestamp_ms:
            if lo == 0:
                raise VersionNotFoundError(
                    f"table {name!r} was created after {timestamp_ms} ms: no version as of then"
                )
            self._tables.check_readable(tx, name, head, lo - 1)  # raises: expired or vacuumed
        while lo < hi:  # at(lo) <= timestamp_ms; the answer is in [lo, hi]
            mid = (lo + hi + 1) // 2
            if at(mid) <= timestamp_ms:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def history(
        self, name: str, *, from_version: int = 0, to_version: int | None = None
    ) -> list[HistoryEntry]:
        """The versions from ``from_version`` to ``to_version`` (``None``: the latest) in
        order, with the files each one added and removed; expired versions (see
        ``retention``) are left out.

        Only what the range needs is read: its log records, the file rows those
        versions wrote (one scan, since file rows sort by generation then version), the
        generations they belong to, and, for a version that started a generation, the
        previous one's live files as of the version before it (what it removed).
        """
        tables, layout = self._tables, self._tables.layout
        with tables.tm.begin() as tx:
            tables.read_head(tx, name)
            expired_below = read_expiry(tx, layout, name).readable_from
            records: dict[int, LogRecord] = {}
            commit_tss: dict[int, int] = {}
            log_end = (
                Layout.prefix_end(name)
                if to_version is None
                else Layout.log_row(name, to_version + 1)
            )
            first = max(from_version, expired_below)
            if to_version is not None and to_version < first:
                return []
            for row, column, value in tx.scan(layout.log, Layout.log_row(name, first), log_end):
                version = Layout.version_of_log_row(name, row)
                if column == Layout.COL_RECORD:
                    records[version] = LogRecord.decode(value)
                elif column == Layout.COL_COMMIT_TS:
                    commit_tss[version] = int(value)
            if not records:
                return []
            by_version: dict[int, list[FileEntry]] = {}
            removed: dict[int, list[FileEntry]] = {}  # from removal rows, then as below
            low, high = min(records), max(records)
            gen_low = min(r.gen for r in records.values())
            gen_high = max(r.gen for r in records.values())
            start = Layout.file_row(name, gen_low, low, 0)
            end = Layout.file_row(name, gen_high, high + 1, 0)
            for (_, version, _), removal, entry in tables.scan_rows(tx, name, start, end):
                if version in records:
                    (removed if removal else by_version).setdefault(version, []).append(entry)
            # From the generation before the range's first: a version that started a
            # generation lists the one it ended from that generation's first version.
            gens = tx.scan(
                layout.gens,
                Layout.gen_row(name, max(gen_low - 1, 0)),
                Layout.gen_row(name, gen_high + 1),
            )
            starts = {g.gen: g.start_version for g in map(Generation.decode, (v for *_, v in gens))}
            # A version that started a generation (an overwrite, or a row-level
            # statement whose removals would have outnumbered the live files) removed
            # the files of the one it ended, as of the version before it: from that
            # generation's checkpoint and rows after it, which expiry keeps.
            rolled = {
                version
                for version, record in records.items()
                if (record.operation == OVERWRITE or record.operation in DML_OPERATIONS)
                and starts.get(record.gen, version) == version
            }
            for version in rolled:
                gen = records[version].gen
                removed[version] = list_gen(
                    tx, layout, name, gen - 1, version - 1, FileEntry, gen_start=starts.get(gen - 1)
                )
        for version, record in records.items():
            if version in rolled and record.operation in DML_OPERATIONS:
                # A row-level statement's generation starts with the files it kept:
                # it added only the others, and removed only those it did not keep.
                before = {e.path for e in removed[version]}
                after = by_version.get(version, [])
                kept = {e.path for e in after} & before
                by_version[version] = [e for e in after if e.path not in kept]
                removed[version] = [e for e in removed[version] if e.path not in kept]
        self._find_commit_tss(name, records, commit_tss)
        return [
            HistoryEntry(
                record,
                commit_tss.get(version),
                by_version.get(version, []),
                removed.get(version, []),
            )
            for version, record in sorted(records.items())
        ]

    def _find_commit_tss(
        self, name: str, records: dict[int, LogRecord], commit_tss: dict[int, int]
    ) -> None:
        """Fill in the commit timestamps of ``records`` that none was recorded for.

        A gateway's catalog records none, and a follow-up that failed left one out.
        Every record was read at a snapshot, so its writer committed: its entry in
        the transactions table has the commit timestamp, and once garbage
        collection deleted the entry, the record's own version carries it as its
        commit stamp (S9 stamps every version before the entry goes). Hence this
        order: an entry missing now was deleted after the stamp was written. A
        catalog over a remote manager has neither; its history keeps ``None``.
        """
        missing = {v: r for v, r in records.items() if v not in commit_tss}
        if not missing or self._outcome_of is None:
            return
        looked_up: dict[int, int | None] = {}
        for version, record in missing.items():
            ts = record.txn_start_ts
            if ts not in looked_up:
                looked_up[ts] = self._outcome_of(ts)
            found = looked_up[ts]
            if found is not None and found >= 0:
                commit_tss[version] = found
        unstamped = sorted(v for v in missing if v not in commit_tss)
        if self._stamps is None:
            return
        log_table = self._tables.layout.log
        for at in range(0, len(unstamped), STAMP_LOOKUP_CELLS):
            chunk = unstamped[at : at + STAMP_LOOKUP_CELLS]
            cells = {Cell(Layout.log_row(name, v), Layout.COL_RECORD): v for v in chunk}
            below = max(missing[v].txn_start_ts for v in chunk) + 1
            found_versions = self._stamps.get_versions(log_table, list(cells), below_ts=below)
            for cell, versions in found_versions.items():
                version = cells[Cell(*cell)]
                for v in versions:
                    if v.ts == missing[version].txn_start_ts and v.commit_ts is not None:
                        commit_tss[version] = v.commit_ts
