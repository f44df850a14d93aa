"""Asynchronous removal of versions left by aborted transactions."""

from __future__ import annotations

import logging
import queue
import threading

from storage_adapters import KVStore, StoreError
from txn._status import OWN_ABORTED_VALUE, TXN_TABLE, txn_key

log = logging.getLogger(__name__)

_Versions = list[tuple[bytes, bytes, int]]
#: Versions to delete, by table, and the writer whose own ABORTED entry goes after them.
_Job = tuple[list[tuple[str, _Versions]], int | None]

#: Bound on queued clean-up work; past it, work is dropped. Dropping is safe: a
#: version of an aborted writer is invisible forever and any reader that meets
#: it queues its removal again (and garbage collection sweeps it below the safe point).
MAX_QUEUED_JOBS = 10_000


class Cleaner:
    """A daemon thread deleting garbage versions. Only aborted writers' versions
    are ever queued, and their ABORTED entry is permanent until they are gone, so
    deleting is always safe.

    A writer that abandoned its own commit (:meth:`submit_abandoned`) wrote its own
    ABORTED entry (``OWN_ABORTED_VALUE``) and never tries its commit point again; once
    every version it wrote is deleted the entry is deleted too, by compare-and-delete,
    so an ABORTED that someone else wrote (which fences a writer that may still be
    alive) is never removed (rule S9).
    """

    def __init__(self, store: KVStore) -> None:
        self._store = store
        self._jobs: queue.Queue[_Job | None] = queue.Queue(MAX_QUEUED_JOBS)
        self._thread = threading.Thread(target=self._run, name="percolake-cleaner", daemon=True)
        self._thread.start()
        self.deleted = 0
        self.entries_deleted = 0

    def submit(self, table: str, versions: _Versions) -> None:
        self._put(([(table, versions)], None))

    def submit_abandoned(self, start_ts: int, versions: list[tuple[str, _Versions]]) -> None:
        """Delete the versions a writer wrote before abandoning, then its own entry."""
        self._put((versions, start_ts))

    def _put(self, job: _Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            log.debug("clean-up queue full; dropping %d tables' versions", len(job[0]))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                versions, own_entry = job
                for table, doomed in versions:
                    self._store.delete_versions(table, doomed)
                    self.deleted += len(doomed)
                if own_entry is not None:
                    key = txn_key(own_entry)
                    if self._store.delete_system(TXN_TABLE, key, OWN_ABORTED_VALUE).applied:
                        self.entries_deleted += 1
            except (StoreError, ValueError) as exc:  # the store closed or failed: retry later
                log.debug("clean-up of aborted versions failed: %s", exc)
            finally:
                self._jobs.task_done()

    def drain(self) -> None:
        """Block until every job queued so far is done (tests, shutdown)."""
        self._jobs.join()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)
