"""Asynchronous removal of versions left by aborted transactions."""

from __future__ import annotations

import logging
import queue
import threading

from storage_adapters import KVStore, StoreError

log = logging.getLogger(__name__)

_Job = tuple[str, list[tuple[bytes, bytes, int]]]

#: Bound on queued clean-up work; past it, work is dropped. Dropping is safe: a
#: version of an aborted writer is invisible forever and any reader that meets
#: it queues its removal again.
MAX_QUEUED_JOBS = 10_000


class Cleaner:
    """A daemon thread deleting garbage versions. Only aborted writers' versions
    are ever queued, and their ABORTED entry is permanent, so deleting is always safe.
    """

    def __init__(self, store: KVStore) -> None:
        self._store = store
        self._jobs: queue.Queue[_Job | None] = queue.Queue(MAX_QUEUED_JOBS)
        self._thread = threading.Thread(target=self._run, name="percolake-cleaner", daemon=True)
        self._thread.start()
        self.deleted = 0

    def submit(self, table: str, versions: list[tuple[bytes, bytes, int]]) -> None:
        try:
            self._jobs.put_nowait((table, versions))
        except queue.Full:
            log.debug("clean-up queue full; dropping %d versions of %s", len(versions), table)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                table, versions = job
                self._store.delete_versions(table, versions)
                self.deleted += len(versions)
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
