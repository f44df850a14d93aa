"""The transactions table and the settling of writers whose outcome is not yet known."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from storage_adapters import Cell, KVStore, StoreError
from txn._config import TransactionConfig
from txn._safepoint import read_state
from txn._services import LockService, commit_lock
from txn.errors import OutcomeForgottenError

log = logging.getLogger(__name__)

#: The transactions table: start_ts -> commit_ts or ABORTED, written only with
#: put-unless-exists, never changed afterwards (rule S1); garbage collection deletes
#: entries no reader needs any more (rule S9).
TXN_TABLE = "_txn"

#: A writer's final outcome: its commit timestamp, or ABORTED.
ABORTED = -1
#: Not an outcome: the version asked about is gone (deleted since it was read), so the
#: reader reads its cell again below it. Only :meth:`StatusResolver.resolve` with
#: ``where`` answers it.
GONE = -2

#: ABORTED written by someone else than the writer (a reader, a conflict check, garbage
#: collection settling it): the writer may still be alive and reach its commit point,
#: which this entry fences for ever, so it is never deleted.
_ABORTED_VALUE = b"A"
#: ABORTED written by the writer itself while abandoning its commit: it never tries
#: its commit point again, so once its versions are gone the entry may go too (S9).
OWN_ABORTED_VALUE = b"a"
_COMMITTED_PREFIX = b"C"


#: Transactions another process attached to, by start_ts: a gateway records one before
#: Attach returns, so that settling a transaction whose owner wrote nothing can tell a
#: read-only transaction (no entry needed) from one whose attached writers wrote.
ATTACHED_TABLE = "_attached"


def mark_attached(store: KVStore, start_ts: int) -> None:
    """Record that ``start_ts`` may hold writes its owner did not make (idempotent)."""
    store.put_unless_exists(ATTACHED_TABLE, txn_key(start_ts), b"1")


def was_attached(store: KVStore, start_ts: int) -> bool:
    return txn_key(start_ts) in store.get_system(ATTACHED_TABLE, [txn_key(start_ts)])


def txn_key(start_ts: int) -> bytes:
    return start_ts.to_bytes(8, "big")


def encode_outcome(outcome: int, *, own: bool = False) -> bytes:
    """An entry's value; ``own`` marks an ABORTED the writer wrote itself."""
    if outcome == ABORTED:
        return OWN_ABORTED_VALUE if own else _ABORTED_VALUE
    return _COMMITTED_PREFIX + outcome.to_bytes(8, "big")


def decode_outcome(raw: bytes) -> int:
    if raw in (_ABORTED_VALUE, OWN_ABORTED_VALUE):
        return ABORTED
    if len(raw) == 9 and raw[:1] == _COMMITTED_PREFIX:
        return int.from_bytes(raw[1:], "big")
    raise ValueError(f"corrupt transactions-table entry {raw!r}")


class StatusResolver:
    """Finds each writer's outcome, settling the undecided ones (rule S3).

    A writer with no entry is never taken to be aborted. If it holds its commit
    lock, the reader waits for it (bounded); then the reader tries to write
    ABORTED with put-unless-exists. Losing that race means the writer committed,
    and the entry it wrote is the answer.
    """

    def __init__(self, store: KVStore, locks: LockService, config: TransactionConfig) -> None:
        self._store = store
        self._locks = locks
        self._config = config
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._cache_lock = threading.Lock()

    def cached(self, start_ts: int) -> int | None:
        with self._cache_lock:
            return self._cache.get(start_ts)

    def clear_cache(self) -> None:
        """Forget every remembered outcome (tests: a reader in another process)."""
        with self._cache_lock:
            self._cache.clear()

    def remember(self, start_ts: int, outcome: int) -> None:
        with self._cache_lock:
            self._cache[start_ts] = outcome
            if len(self._cache) > self._config.status_cache_size:
                self._cache.popitem(last=False)

    def read(self, start_tss: Iterable[int]) -> dict[int, int]:
        """Outcomes known now (cache, then the table); undecided writers left out."""
        out: dict[int, int] = {}
        missing = []
        for ts in set(start_tss):
            known = self.cached(ts)
            if known is None:
                missing.append(ts)
            else:
                out[ts] = known
        if missing:
            # Entries are written once: Cassandra reads them without Paxos where it can.
            rows = self._store.get_system_final(TXN_TABLE, [txn_key(ts) for ts in missing])
            for ts in missing:
                raw = rows.get(txn_key(ts))
                if raw is not None:
                    out[ts] = decode_outcome(raw)
                    self.remember(ts, out[ts])
        return out

    def resolve(
        self,
        start_tss: Iterable[int],
        *,
        where: Mapping[int, tuple[str, Cell]] | None = None,
    ) -> dict[int, int]:
        """Final outcomes of every writer, settling undecided ones.

        ``where`` names, for a writer, a cell where the caller found one of its
        versions. A writer with no entry is then checked there before it is settled:
        garbage collection deletes a committed writer's entry only after stamping or
        deleting every version of it (rule S9), so a version read before that may have
        lost its entry since. Found stamped, the stamp is the outcome; found gone, the
        answer is :data:`GONE` (read the cell again); found unstamped, the writer never
        committed before the entry went and is settled as usual.
        """
        wanted = set(start_tss)
        out = self.read(wanted)
        undecided = wanted - out.keys()
        if not undecided:
            return out
        self._wait_for(undecided)
        out.update(self.read(undecided))
        for ts in sorted(undecided - out.keys()):
            if where and ts in where:
                out[ts] = self._settle_seen(ts, where[ts])
            else:
                out[ts] = self.settle(ts, waited=True)
        return out

    def _wait_for(self, start_tss: Iterable[int]) -> None:
        """Wait on live committers instead of aborting them (liveness, rule S5). If the
        lock server cannot tell, settle at once: that may abort a live committer, which
        costs it a retry and never safety."""
        undecided = sorted(start_tss)
        try:
            self._locks.wait_until_released(
                [commit_lock(ts) for ts in undecided], self._config.resolve_wait_ms
            )
        except Exception as exc:
            log.debug("lock server unavailable while resolving %s: %s", undecided, exc)

    def _settle_seen(self, start_ts: int, at: tuple[str, Cell]) -> int:
        """Settle a writer with no entry, one of whose versions the caller read at ``at``.

        Present and unstamped there, it never committed up to now, even below the safe
        point: a writer whose entry was collected has no unstamped version left (S9).
        It is fenced with ABORTED. If a safe point above it was published meanwhile, its
        entry may have been committed and collected between the re-check and the put;
        the version is read once more and a stamp on it wins.
        """
        seen = self._recheck(start_ts, at)
        if seen is not None:
            return seen
        outcome, applied = self._put_aborted(start_ts)
        if not applied or not self._collectable(start_ts):
            return outcome
        again = self._recheck(start_ts, at)
        if again is not None and again != GONE:
            log.error(
                "transaction %d was settled ABORTED after its committed entry was "
                "collected; its commit stamp stands",
                start_ts,
            )
            return again
        return ABORTED

    def settle(
        self, start_ts: int, written: Sequence[tuple[str, Cell]] = (), *, waited: bool = False
    ) -> int:
        """The final outcome of ``start_ts``, for its own client or anyone who knows only
        its id (``Status(settle=True)``, ``outcome(txn_id, settle=True)``, rule S6).

        ``written``: cells the writer wrote, if the caller knows them. A writer with no
        entry is settled by writing ABORTED only while its entry cannot have been
        collected: garbage collection deletes a committed writer's entry once its
        versions carry commit stamps, and only below a safe point it published first
        (S9). So below the safe point the writer's versions decide: stamped, it
        committed; present and unstamped, it never did and is fenced; neither (gone, or
        no cells known), the outcome is no longer known and
        :class:`~txn.errors.OutcomeForgottenError` says so. Nothing is written then.
        ``waited``: the caller already waited for a live committer.
        """
        if not waited:
            found = self.read([start_ts]).get(start_ts)
            if found is not None:
                return found
            self._wait_for([start_ts])
        safe_point = read_state(self._store)[0].safe_point  # before the entry is read
        found = self.read([start_ts]).get(start_ts)
        if found is not None:
            return found
        stamp, unstamped = self._probe(start_ts, written)
        if stamp is not None:
            return stamp
        if start_ts < safe_point and not unstamped:
            raise self._forgotten(start_ts, safe_point, written)
        outcome, applied = self._put_aborted(start_ts)
        if not applied or not self._collectable(start_ts):
            return outcome
        # A pass published a safe point above us while we settled: the entry may have
        # been committed and collected between our read and our put. The versions say.
        stamp, unstamped = self._probe(start_ts, written)
        if stamp is not None:
            log.error(
                "transaction %d was settled ABORTED after its committed entry was "
                "collected; its commit stamp stands",
                start_ts,
            )
            return stamp
        if unstamped:
            return ABORTED
        raise self._forgotten(start_ts, safe_point, written)

    def _collectable(self, start_ts: int) -> bool:
        """Whether a committed entry of ``start_ts`` may have been collected by now:
        only below a safe point published before the deletion (S9)."""
        return start_ts < read_state(self._store)[0].safe_point

    def _probe(self, start_ts: int, written: Sequence[tuple[str, Cell]]) -> tuple[int | None, bool]:
        """``(commit stamp found, an unstamped version found)`` among ``written``."""
        by_table: dict[str, list[Cell]] = {}
        for table, cell in written:
            by_table.setdefault(table, []).append(cell)
        unstamped = False
        for table, cells in sorted(by_table.items()):
            found = self._store.get_versions(table, cells, below_ts=start_ts + 1, limit=1)
            for versions in found.values():
                if not versions or versions[0].ts != start_ts:
                    continue
                if versions[0].commit_ts is not None:
                    self.remember(start_ts, versions[0].commit_ts)
                    return versions[0].commit_ts, False
                unstamped = True
        return None, unstamped

    @staticmethod
    def _forgotten(
        start_ts: int, safe_point: int, written: Sequence[tuple[str, Cell]]
    ) -> OutcomeForgottenError:
        where = (
            f"none of the {len(written)} cells it wrote holds a version of it with a commit stamp"
            if written
            else "the cells it wrote were not given"
        )
        return OutcomeForgottenError(
            f"the outcome of transaction {start_ts} is no longer known: it is below the "
            f"garbage-collection safe point {safe_point}, so its transactions-table entry may "
            f"have been collected, and {where}. It may have committed; read the data back",
            start_ts=start_ts,
        )

    def _recheck(self, start_ts: int, at: tuple[str, Cell]) -> int | None:
        """The outcome a version of ``start_ts`` carries now: its stamp, :data:`GONE`, or
        ``None`` (present, unstamped)."""
        table, cell = at
        versions = self._store.get_versions(table, [cell], below_ts=start_ts + 1, limit=1)
        newest = versions.get(cell)
        if not newest or newest[0].ts != start_ts:
            return GONE
        if newest[0].commit_ts is not None:
            self.remember(start_ts, newest[0].commit_ts)
            return newest[0].commit_ts
        return None

    def settle_aborted(self, start_ts: int, *, own: bool = False) -> int:
        """Try to write ABORTED for ``start_ts``; returns the outcome that stands.

        ``own``: the writer itself gives up (see :data:`OWN_ABORTED_VALUE`).
        """
        return self._put_aborted(start_ts, own=own)[0]

    def _put_aborted(self, start_ts: int, *, own: bool = False) -> tuple[int, bool]:
        """Put-unless-exists ABORTED: the outcome that stands, and whether ours applied."""
        result = self._store.put_unless_exists(
            TXN_TABLE, txn_key(start_ts), encode_outcome(ABORTED, own=own)
        )
        if result.current is None:
            # The store broke its contract: neither applied nor showed the row that
            # stopped it. Taking that as ABORTED could contradict a commit (S3).
            raise StoreError(
                f"put-unless-exists of transaction {start_ts}'s outcome returned no value "
                f"(applied={result.applied}); its outcome stays unknown"
            )
        outcome = decode_outcome(result.current)
        if result.applied:
            log.debug("settled undecided transaction %d as aborted", start_ts)
        self.remember(start_ts, outcome)
        return outcome, result.applied
