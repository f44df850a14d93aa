"""Lakehouse retention: expiring old log records, file rows and idempotency marks.

Without it a table keeps every log record, file row and mark for ever, and a
streaming table gains a batch mark and a job mark per micro-batch. Two table
properties (:class:`Retention`, like Delta's ``delta.logRetentionDuration`` and
``delta.setTransactionRetentionDuration``) bound them:

* **Log retention** (default 30 days, Delta's default). A version stays readable
  while it is the latest or was replaced less than the log retention ago (the rule
  vacuum applies to files). Older versions *expire*: reading them raises
  ``VersionNotFoundError`` saying so, history leaves them out, and the rows only
  they need are deleted: their log records, the file rows and older checkpoints
  that the newest checkpoint at or below the oldest readable version makes
  unnecessary, and every row of a generation no readable version lists. (The
  generation just before the oldest readable version keeps its newest checkpoint
  and the rows after it when that version is the overwrite that ended it: history
  lists what it removed.) No checkpoint at or below the oldest readable version: no
  file row of its generation goes, because readers still list them one by one.
* **Mark retention** (default 7 days). The ``(app_id, batch_id)`` mark of a version
  that committed longer ago is deleted, and **a replay of that batch id is
  committed again**, as a new version (Delta's ``setTransactionRetentionDuration``
  has the same effect). Seven days because a mark guards against a streaming
  query that committed a micro-batch and stopped before checkpointing it: the
  replay comes when the query restarts, so the mark must outlive the longest time
  a query stays down; a week covers a long weekend and an incident on top. Job
  marks (a commit resent after its reply was lost lands once) are kept at least
  :data:`JOB_MARK_MIN_RETENTION_S` whatever the setting: resends stop after the
  client's commit deadline (300 s by default).

Ages are the versions' commit times as the log records them (the committing
catalog's clock, never decreasing) against the expiring process's clock.

Layout: two more cells in the catalog's ``tables`` table, row ``name``: column
``r`` holds the table's :class:`Retention` (absent: the defaults), column ``x``
its :class:`ExpiryState`.

How (``Catalog.expire``): one transaction publishes the new bounds
(:func:`publish_expiry`); when versions newly expire it also raises the head's
``min_readable_version`` (so it conflicts with commits and retries like vacuum's
fence), and readers refuse those versions from then on. Only then do later
transactions (:func:`expire_step`, at most :data:`STEP_ROWS` deletes each) delete
rows, each one only needed by versions below the bound its own snapshot reads. A
mark's version comes from its log record, so log records go only after their
marks. The deletes are ordinary transactional deletes: readers at older snapshots
still see the rows, and ``percolake gc``'s version sweep removes them physically.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_integration.engine.errors import LakehouseError
from spark_integration.engine.model import CREATE, Checkpoint, Generation, Head, Layout, LogRecord

if TYPE_CHECKING:
    from txn import ReadTransaction, Transaction

DAY_S = 86_400.0
#: Delta's default ``delta.logRetentionDuration``.
DEFAULT_LOG_RETENTION_S = 30 * DAY_S
#: How long a batch mark keeps a replay from committing again (see the module doc).
DEFAULT_MARK_RETENTION_S = 7 * DAY_S
#: Job marks live at least this long: a client resends a commit whose reply it lost
#: until its commit deadline (``commit_timeout_s``, 300 s by default), and a resend
#: that found no mark would commit the same files twice. A day leaves a wide margin
#: for longer deadlines and for clocks.
JOB_MARK_MIN_RETENTION_S = DAY_S

#: Cells one expiry transaction deletes at most (a checkpoint's chunks go together,
#: so one may exceed it): transactions stay small on every store.
STEP_ROWS = 1_000
#: Versions one step reads log records of: each costs at most four deletes (two
#: marks, the record and its commit timestamp).
STEP_VERSIONS = STEP_ROWS // 4

COL_RETENTION = b"r"
COL_EXPIRY = b"x"


@dataclass(frozen=True, slots=True)
class Retention:
    """A table's retention properties, in seconds; see the module doc for their effect."""

    log_retention_s: float = DEFAULT_LOG_RETENTION_S
    mark_retention_s: float = DEFAULT_MARK_RETENTION_S

    def __post_init__(self) -> None:
        for label, value in (
            ("log_retention_s", self.log_retention_s),
            ("mark_retention_s", self.mark_retention_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{label} must be a number, got {type(value).__name__}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{label} must be finite and >= 0, got {value}")

    def encode(self) -> bytes:
        return _dump({"log_s": self.log_retention_s, "mark_s": self.mark_retention_s})

    @classmethod
    def decode(cls, raw: bytes) -> Retention:
        d = _load(raw)
        return cls(float(d["log_s"]), float(d["mark_s"]))


@dataclass(frozen=True, slots=True)
class ExpiryState:
    """How far expiry has gone for one table. Every bound only rises.

    ``readable_from``: versions below it expired (published before any of their rows
    go). ``marks_until``/``job_marks_until``: batch/job marks of versions below them
    are to go; ``marks_done``/``job_marks_done``/``log_done``: below these they went.
    ``gens_done``: every row of the generations below it went, their ``gens`` rows
    too. ``partial``: generation -> the version of the checkpoint it keeps (its
    older checkpoints and the file rows that checkpoint holds went), so later passes
    scan from there.
    """

    readable_from: int = 0
    marks_until: int = 0
    job_marks_until: int = 0
    marks_done: int = 0
    job_marks_done: int = 0
    log_done: int = 0
    gens_done: int = 0
    partial: dict[int, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump(
            {
                "r": self.readable_from,
                "mu": self.marks_until,
                "ju": self.job_marks_until,
                "md": self.marks_done,
                "jd": self.job_marks_done,
                "ld": self.log_done,
                "gd": self.gens_done,
                "p": {str(g): v for g, v in sorted(self.partial.items())},
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> ExpiryState:
        d = _load(raw)
        return cls(
            int(d["r"]),
            int(d["mu"]),
            int(d["ju"]),
            int(d["md"]),
            int(d["jd"]),
            int(d["ld"]),
            int(d["gd"]),
            {int(g): int(v) for g, v in d["p"].items()},
        )

    @property
    def log_until(self) -> int:
        """Log records below this go: expired, and their marks (indexed by them) gone."""
        return min(self.readable_from, self.marks_done, self.job_marks_done)


@dataclass(slots=True)
class ExpireResult:
    """What one expiry did: the oldest readable version after it, and cells deleted."""

    readable_from: int = 0
    batch_marks: int = 0
    job_marks: int = 0
    log_cells: int = 0
    file_rows: int = 0
    checkpoints: int = 0
    generations: int = 0

    @property
    def deleted(self) -> int:
        return (
            self.batch_marks
            + self.job_marks
            + self.log_cells
            + self.file_rows
            + self.checkpoints
            + self.generations
        )

    def add(self, other: ExpireResult) -> None:
        self.readable_from = max(self.readable_from, other.readable_from)
        for f in dataclasses.fields(self):
            if f.name != "readable_from":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


# --- the cells -----------------------------------------------------------------------


def read_retention(tx: ReadTransaction, layout: Layout, name: str) -> Retention:
    raw = tx.get(layout.tables, Layout.name_row(name), COL_RETENTION)
    return Retention() if raw is None else Retention.decode(raw)


def write_retention(tx: Transaction, layout: Layout, name: str, retention: Retention) -> None:
    tx.put(layout.tables, Layout.name_row(name), COL_RETENTION, retention.encode())


def read_expiry(tx: ReadTransaction, layout: Layout, name: str) -> ExpiryState:
    raw = tx.get(layout.tables, Layout.name_row(name), COL_EXPIRY)
    return ExpiryState() if raw is None else ExpiryState.decode(raw)


def _write_expiry(tx: Transaction, layout: Layout, name: str, state: ExpiryState) -> None:
    tx.put(layout.tables, Layout.name_row(name), COL_EXPIRY, state.encode())


def describe_s(seconds: float) -> str:
    """``30 days``, ``12 h``, ``90 s``: a retention as people say it."""
    if seconds >= DAY_S and seconds % DAY_S == 0:
        days = int(seconds // DAY_S)
        return f"{days} day" + ("s" if days != 1 else "")
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    return f"{seconds:g} s"


# --- publishing the bounds -----------------------------------------------------------


@dataclass(slots=True)
class PublishMemo:
    """What one expiry's attempts at :func:`publish_expiry` learnt, kept across its
    retries (issue 27): the commit times of the log records they read, by version,
    and the bounds the last attempt computed, tried first by the next one.

    A retried publish then reads the head, the retention and the expiry state, and
    finds its bounds in the memo: it no longer repeats a binary search of about
    log2(versions) sequential log reads, during which every commit of the table made
    it conflict again. (On one Cassandra node under load, with commits every 20 ms,
    the gateway's follow-up thread spent over 60 s in one publish, and the table's
    file rows went unexpired meanwhile.) A version's commit time never changes once
    its log record is readable: the record is written by the commit that made the
    version, and only deleted, never rewritten. A remembered bound is only a guess:
    it is used when the attempt's own snapshot confirms it is the least version
    where the bound holds, and searched for as before otherwise.
    """

    times: dict[int, int] = field(default_factory=dict)
    readable_from: int | None = None
    marks_until: int | None = None
    job_marks_until: int | None = None


def publish_expiry(
    tx: Transaction,
    layout: Layout,
    name: str,
    head: Head,
    now_ms: int,
    memo: PublishMemo | None = None,
) -> ExpiryState:
    """Compute the bounds as of ``now_ms`` and publish them; returns the new state.

    ``head`` is the table's, read in ``tx``. Writes the head only when versions
    newly expire (its ``min_readable_version`` rises): then readers refuse them
    before any of their rows go, and the write conflicts with commits, which retry.
    Each bound is a binary search over log records that still exist (those from the
    lowest bound up), about log2(versions) reads, one when nothing moved; ``memo``
    (one per expiry, shared by its retries) lets a retry skip the search.
    """
    retention = read_retention(tx, layout, name)
    state = read_expiry(tx, layout, name)
    memo = PublishMemo() if memo is None else memo
    times = memo.times

    def committed_ms(version: int) -> int:
        if version not in times:
            raw = tx.get(layout.log, Layout.log_row(name, version), Layout.COL_RECORD)
            if raw is None:
                raise LakehouseError(
                    f"table {name!r} has no log record of version {version}, which "
                    "expiry has not removed"
                )
            times[version] = LogRecord.decode(raw).timestamp_ms
        return times[version]

    log_cutoff = now_ms - int(retention.log_retention_s * 1000)
    mark_cutoff = now_ms - int(retention.mark_retention_s * 1000)
    job_cutoff = now_ms - int(max(retention.mark_retention_s, JOB_MARK_MIN_RETENTION_S) * 1000)
    latest = head.version
    # A version stays readable while it is the latest or its successor is younger
    # than the cutoff (it was the latest at some time inside the retention).
    readable = _first(
        state.readable_from,
        latest,
        lambda v: v == latest or committed_ms(v + 1) >= log_cutoff,
        memo.readable_from,
    )

    def marks_bound(start: int, cutoff: int, guess: int | None) -> int:
        return _first(start, latest + 1, lambda v: v > latest or committed_ms(v) >= cutoff, guess)

    new = dataclasses.replace(
        state,
        readable_from=readable,
        marks_until=marks_bound(state.marks_until, mark_cutoff, memo.marks_until),
        job_marks_until=marks_bound(state.job_marks_until, job_cutoff, memo.job_marks_until),
    )
    memo.readable_from = new.readable_from
    memo.marks_until, memo.job_marks_until = new.marks_until, new.job_marks_until
    if new != state:
        _write_expiry(tx, layout, name, new)
    if readable > head.min_readable_version:
        raised = dataclasses.replace(head, min_readable_version=readable)
        tx.put(layout.head, Layout.name_row(name), Layout.COL_HEAD, raised.encode())
    return new


def _first(lo: int, hi: int, holds: Callable[[int], bool], guess: int | None = None) -> int:
    """The least ``v`` in ``[lo, hi]`` where ``holds`` (monotone, true at ``hi``).

    ``guess``: tried first; taken only where ``holds`` is false just below it and true
    at it (then it is the least, ``holds`` being monotone), else searched as without.
    """
    if lo >= hi or holds(lo):  # the usual case: nothing moved since the last pass
        return lo
    if guess is not None and lo < guess <= hi and holds(guess) and not holds(guess - 1):
        return guess
    while hi - lo > 1:  # holds(hi) and not holds(lo)
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


# --- deleting ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepOutcome:
    deleted: ExpireResult
    more: bool  # stopped at the row budget: run another step


class _Step:
    """One bounded transaction of deletes, below the bounds its own snapshot reads.

    Pure per attempt: the retry loop runs it again on a fresh transaction.
    """

    def __init__(self, tx: Transaction, layout: Layout, name: str, budget: int) -> None:
        self.tx = tx
        self.layout = layout
        self.name = name
        self.budget = budget
        self.out = ExpireResult()

    def _delete(self, table: str, row: bytes, column: bytes) -> None:
        self.tx.delete(table, row, column)
        self.budget -= 1

    def run(self) -> StepOutcome:
        start = read_expiry(self.tx, self.layout, self.name)
        state = self._marks_and_log(start)
        more = self.budget <= 0
        if not more:
            state, more = self._generations(state)
        if state != start:
            _write_expiry(self.tx, self.layout, self.name, state)
        self.out.readable_from = state.readable_from
        return StepOutcome(self.out, more)

    def _marks_and_log(self, state: ExpiryState) -> ExpiryState:
        """Marks of versions below their bounds, then log records below ``log_until``."""
        layout, name = self.layout, self.name
        while self.budget > 0:
            cursors = [
                c
                for c, until in (
                    (state.marks_done, state.marks_until),
                    (state.job_marks_done, state.job_marks_until),
                    (state.log_done, state.log_until),
                )
                if c < until
            ]
            if not cursors:
                return state
            lo = min(cursors)
            hi = lo + max(1, min(STEP_VERSIONS, self.budget // 4))
            records: dict[int, LogRecord] = {}
            cells: list[tuple[bytes, bytes, int]] = []  # log cells, with their version
            for row, column, value in self.tx.scan(
                layout.log, Layout.log_row(name, lo), Layout.log_row(name, hi)
            ):
                version = Layout.version_of_log_row(name, row)
                cells.append((row, column, version))
                if column == Layout.COL_RECORD:
                    records[version] = LogRecord.decode(value)
            marks_done = max(state.marks_done, min(hi, state.marks_until))
            job_marks_done = max(state.job_marks_done, min(hi, state.job_marks_until))
            wanted: dict[bytes, tuple[int, str]] = {}  # mark row -> (version, kind)
            for version, record in records.items():
                if (
                    state.marks_done <= version < marks_done
                    and record.app_id is not None
                    and record.batch_id is not None
                ):
                    row = Layout.mark_row(name, record.app_id, record.batch_id)
                    wanted[row] = (version, "batch")
                if (
                    state.job_marks_done <= version < job_marks_done
                    and record.job_id
                    and record.operation != CREATE  # a create writes no job mark
                ):
                    wanted[Layout.job_mark_row(name, record.job_id)] = (version, "job")
            found = self.tx.get_many(layout.marks, [(row, Layout.COL_MARK) for row in wanted])
            for (row, column), value in found.items():
                version, kind = wanted[row]
                # A mark expired before may have been written again by a replay that
                # committed a later version: that one is not this version's to delete.
                if int(value) != version:
                    continue
                self._delete(layout.marks, row, column)
                if kind == "batch":
                    self.out.batch_marks += 1
                else:
                    self.out.job_marks += 1
            state = dataclasses.replace(state, marks_done=marks_done, job_marks_done=job_marks_done)
            log_done = max(state.log_done, min(hi, state.log_until))
            for row, column, version in cells:
                if state.log_done <= version < log_done:
                    self._delete(layout.log, row, column)
                    self.out.log_cells += 1
            state = dataclasses.replace(state, log_done=log_done)
        return state

    def _generations(self, state: ExpiryState) -> tuple[ExpiryState, bool]:
        """Rows of generations that no readable version needs; ``(state, more)``."""
        layout, name, tx = self.layout, self.name, self.tx
        readable = state.readable_from
        if readable == 0:
            # Every version is readable (a table younger than its log retention):
            # every generation is the oldest readable one or later, and of the oldest
            # the loop below would keep every row (``rows_below`` is 0). Two scans
            # saved, each a request per shard on Cassandra, after every checkpoint.
            return state, False
        gens = [
            Generation.decode(value)
            for _, _, value in tx.scan(
                layout.gens, Layout.gen_row(name, state.gens_done), Layout.prefix_end(name)
            )
        ]
        starts = {g.gen: g.start_version for g in gens}
        # The generation of the oldest readable version: it and later ones are read.
        oldest = max((g.gen for g in gens if g.start_version <= readable), default=None)
        gens_done, partial = state.gens_done, dict(state.partial)

        def result(more: bool) -> tuple[ExpiryState, bool]:
            kept = {g: v for g, v in partial.items() if g >= gens_done}
            return dataclasses.replace(state, gens_done=gens_done, partial=kept), more

        for g in sorted(starts):
            if oldest is None or g > oldest:
                break
            if g == oldest:
                need: int | None = readable
            elif g == oldest - 1 and starts[oldest] == readable and readable > 0:
                need = readable - 1  # its last version: what that overwrite removed
            else:
                need = None
            scan_from = partial.get(g, 0)
            if need is None:  # no readable version lists this generation
                if not self._drop(g, scan_from, None, None):
                    return result(True)
                self._delete(layout.gens, Layout.gen_row(name, g), Layout.COL_GEN)
                self.out.generations += 1
                gens_done = g + 1
                continue
            kept = self._newest_checkpoint(g, scan_from, need)
            if kept is None:
                continue  # readers list this generation row by row: every row is needed
            # The kept checkpoint holds every row up to its version; rows of readable
            # versions stay all the same (history lists what each one added).
            rows_below = min(kept.version, readable - 1) + 1
            if not self._drop(g, scan_from, rows_below, kept.version):
                return result(True)
            partial[g] = kept.version
        return result(self.budget <= 0)

    def _newest_checkpoint(self, gen: int, scan_from: int, at_most: int) -> Checkpoint | None:
        start, end = Layout.file_range(
            self.name, gen, from_version=scan_from, below_version=at_most + 1
        )
        newest: Checkpoint | None = None
        for _, _, value in self.tx.scan(self.layout.checkpoints, start, end):
            newest = Checkpoint.decode(value)
        return newest

    def _drop(
        self, gen: int, scan_from: int, rows_below: int | None, checkpoints_below: int | None
    ) -> bool:
        """Delete ``gen``'s file rows below ``rows_below`` and its checkpoints below
        ``checkpoints_below`` (``None``: all of them); ``False`` if the budget ran out."""
        layout, name, tx = self.layout, self.name, self.tx
        start, end = Layout.file_range(
            name, gen, from_version=scan_from, below_version=checkpoints_below
        )
        for row, _, value in tx.scan(layout.checkpoints, start, end):
            if self.budget <= 0:
                return False
            marker = Checkpoint.decode(value)
            for index in range(marker.chunks):
                self._delete(layout.chunks, row, Layout.chunk_column(index))
            self._delete(layout.checkpoints, row, Layout.COL_CHECKPOINT)
            self.out.checkpoints += 1
        start, end = Layout.file_range(name, gen, from_version=scan_from, below_version=rows_below)
        for row, column, _ in tx.scan(layout.files, start, end):
            if self.budget <= 0:
                return False
            self._delete(layout.files, row, column)
            self.out.file_rows += 1
        return True


def expire_step(tx: Transaction, layout: Layout, name: str, budget: int = STEP_ROWS) -> StepOutcome:
    """Delete at most about ``budget`` cells that the published bounds make unneeded."""
    return _Step(tx, layout, name, budget).run()


def _dump(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()


def _load(raw: bytes) -> dict[str, Any]:
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ValueError(f"corrupt lakehouse retention cell: {raw[:80]!r}")
    return d
