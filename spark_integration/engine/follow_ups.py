"""The follow-up work of a commit that committed: its commit timestamp, checkpoints, expiry.

After the commit point nothing is undone: this work runs in transactions of its
own, and its failures are logged, never raised, because the caller would take them
for a failed commit and delete or re-append the files of a version that stands.
Only derived data depends on it, and readers and later commits do without it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.checkpoints import checkpoint_due, write_checkpoint
from spark_integration.engine.expiry import Expiry
from spark_integration.engine.model import Layout
from spark_integration.engine.retention import STEP_ROWS
from spark_integration.engine.table_access import TableAccess

log = logging.getLogger(__name__)

#: Cells the expiry that follows a checkpoint deletes at most: a commit (embedded)
#: or the gateway's follow-up thread is not held up long by a table's first expiry
#: after years; what is left goes after the next checkpoint.
FOLLOW_UP_EXPIRE_ROWS = 10 * STEP_ROWS


@dataclass(frozen=True, slots=True)
class NewVersion:
    """A version one transaction just wrote: what its follow-up work needs."""

    version: int
    job_id: str
    gen: int
    gen_start: int


class FollowUps:
    """Runs the follow-up work of new versions, now or on a background executor.

    ``run_later`` is a gateway's executor (``None``: the work runs before the commit
    returns). ``record_commit_ts``: a gateway's catalog records no commit
    timestamps (one transaction less per commit); its history finds each one
    where the store keeps it (``history``).
    """

    def __init__(
        self,
        tables: TableAccess,
        expiry: Expiry,
        *,
        run_later: Callable[[Callable[[], None]], object] | None,
        record_commit_ts: bool,
    ) -> None:
        self._tables = tables
        self._expiry = expiry
        self._run_later = run_later
        self._record_commit_ts = record_commit_ts
        #: (table, generation) -> the newest version due a checkpoint whose follow-up is
        #: queued on ``run_later``; an entry goes when that follow-up runs.
        self._newest_due: dict[tuple[str, int], int] = {}
        self._due_lock = threading.Lock()

    def schedule(self, name: str, fresh: Sequence[NewVersion], commit_ts: int | None) -> None:
        """:meth:`run` now, or on ``run_later`` when the catalog has one; never raises."""
        if self._run_later is None:
            self.run(name, fresh, commit_ts)
            return
        try:
            self._run_later(lambda: self.run(name, fresh, commit_ts))
        except Exception as exc:  # a closed executor, say: the commit stands
            log.warning("follow-up work of table %r not queued: %r", name, exc)
            return
        with self._due_lock:
            for new in _due(fresh).values():
                key = (name, new.gen)
                self._newest_due[key] = max(self._newest_due.get(key, -1), new.version)

    def _superseded(self, name: str, new: NewVersion) -> bool:
        """Whether a follow-up queued after this one checkpoints a newer version of the
        same generation (issue 27). A queue that falls behind the commits (a gateway on
        a slow store: every checkpoint rewrites the generation's live set) then writes
        only the newest checkpoint, not every stale one on the way, and the expiry that
        follows it runs once: otherwise the queue only grows, and so does the live set
        each checkpoint rewrites, and expiry, which needs a checkpoint at or below the
        oldest readable version, keeps every file row since the last one it reached
        (on one Cassandra node, 8,100 of 10,000 appends' file rows stayed, 3,800 on
        SQLite). Skipping loses nothing: checkpoints are derived data, and the newer
        follow-up writes the newer one; if it fails, the next due version's does."""
        with self._due_lock:
            key = (name, new.gen)
            newest = self._newest_due.get(key)
            if newest is not None and newest <= new.version:
                del self._newest_due[key]
            return newest is not None and newest > new.version

    def run(self, name: str, fresh: Sequence[NewVersion], commit_ts: int | None) -> None:
        """The follow-up work of versions that one transaction committed; never raises.

        The commit timestamps of all of them are recorded in one transaction; a
        checkpoint is written at the newest version due one, per generation.
        """
        where = f"table {name!r} version {fresh[0].version}" + (
            f"-{fresh[-1].version}" if len(fresh) > 1 else ""
        )
        for new in fresh:
            self._guarded(fp.AFTER_COMMIT_POINT, new.job_id, f"follow-up work of {where}")
        # Unknown when an unknown outcome was settled.
        if commit_ts is not None and self._record_commit_ts:
            self._guarded(
                fp.BEFORE_RECORD_COMMIT_TS,
                fresh[0].job_id,
                f"recording the commit_ts of {where}",
                lambda: self._write_commit_ts(name, [n.version for n in fresh], commit_ts),
            )
        due = _due(fresh)
        if self._run_later is not None:
            due = {gen: new for gen, new in due.items() if not self._superseded(name, new)}
        tables = self._tables
        for new in due.values():
            self._guarded(
                fp.BEFORE_CHECKPOINT,
                new.job_id,
                f"the checkpoint of table {name!r} version {new.version}",
                lambda n=new: write_checkpoint(  # type: ignore[misc]
                    tables.tm, tables.layout, name, n.gen, n.gen_start, n.version
                ),
            )
        if due:
            # Retention's work comes with checkpoints, as Delta's log cleanup does: a
            # checkpoint is what lets old file rows go, and it comes every 100 or
            # 1,000 versions, so expiry's reads stay a small share of the commits'.
            newest = fresh[-1]
            self._guarded(
                fp.BEFORE_EXPIRE,
                newest.job_id,
                f"expiry of table {name!r} after version {newest.version}",
                lambda: self._expire_quietly(name),
            )

    def _guarded(
        self, point: str, job_id: str, what: str, work: Callable[[], None] | None = None
    ) -> None:
        """Run follow-up work of a commit that already committed; log failures, never raise.

        The version stands whatever happens here. Reporting a failure would make the
        caller treat the commit as failed: delete files the version names, or retry
        and append them twice when it has no (app_id, batch_id). Hence
        ``Exception``, not ``TransactionError``: a store timeout, a fenced oracle or
        an unreachable gateway can come from any layer, typed or not.
        """
        try:
            self._tables.failpoints.hit(point, job_id)
            if work is not None:
                work()
        except Exception as exc:
            log.warning("%s failed after the commit, which stands: %r", what, exc)

    def _write_commit_ts(self, name: str, versions: Sequence[int], commit_ts: int) -> None:
        """Record the commit timestamp, which the commit itself cannot know (history only).

        Only history's commit_ts depends on it, and history finds it without the
        record where the catalog reaches the store (``History._find_commit_tss``);
        a remote manager's catalog keeps ``None`` for a version whose record failed.
        """
        layout = self._tables.layout
        with self._tables.tm.begin() as tx:
            for version in versions:
                tx.put(
                    layout.log,
                    Layout.log_row(name, version),
                    Layout.COL_COMMIT_TS,
                    str(commit_ts).encode(),
                )

    def _expire_quietly(self, name: str) -> None:
        result = self._expiry.expire(name, self._tables.clock_ms(), max_rows=FOLLOW_UP_EXPIRE_ROWS)
        if result.deleted:
            log.info("expiry of %s: %s", name, result)


def _due(fresh: Sequence[NewVersion]) -> dict[int, NewVersion]:
    """The newest of ``fresh`` due a checkpoint, by generation."""
    due: dict[int, NewVersion] = {}
    for new in fresh:
        if checkpoint_due(new.version - new.gen_start):
            due[new.gen] = new
    return due
