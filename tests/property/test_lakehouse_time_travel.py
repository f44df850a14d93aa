"""Time travel by timestamp is repeatable, and history keeps its commit timestamps.

Hypothesis interleaves, on one store, commit attempts of several committers whose
clocks are skewed against each other (each a ``Catalog`` with its own ``clock_ms``),
split into their two halves: the attempt that reads the head and takes the log time
(``GroupAttempt.run``, buffered in an open transaction) and, any number of steps
later, its commit. Between them go ``version_at`` questions from any catalog at
times up to its own clock, garbage collection passes at retention 0, and readers
that forget what they knew (the resolver's cache cleared, fresh catalogs).

Checked after every step:

* once ``version_at(T)`` answered, it answers the same for ever, from any catalog
  (issue 30, item 3);
* log times never decrease from one version to the next;
* every answer is the newest version whose log time is at or below ``T``;
* history gives every version the commit timestamp its commit returned, after GC
  collected the transactions-table entries and the caches are gone (item 2).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from spark_integration import ConcurrentModificationError, VersionNotFoundError
from spark_integration.engine import Catalog, CommitRequest
from spark_integration.engine.commit import GroupAttempt
from spark_integration.engine.history import History
from spark_integration.engine.model import APPEND, OVERWRITE, FileEntry, LogRecord, TableMeta
from txn import GarbageCollector, Transaction, TransactionConfig, TransactionManager
from txn.errors import TransactionAbortedError
from txn.tables import GC_TABLE, STATE_KEY, GcState

pytestmark = pytest.mark.property

TABLE = "t"
CATALOG = "tt"
CONFIG = TransactionConfig(resolve_wait_ms=50, lock_wait_ms=200, settle_backoff_ms=0)
COMMITTERS = 3
#: Skews of the committers' clocks against the reader's, in ms: wide against the
#: steps time advances by, so a committer behind takes log times others passed.
SKEWS = st.integers(-60, 60)
START_MS = 1_000_000


class Clock:
    """Shared "real" time in ms; each catalog reads it through its own skew."""

    def __init__(self) -> None:
        self.now = START_MS

    def skewed(self, skew_ms: int) -> Callable[[], int]:
        return lambda: self.now + skew_ms


class TimeTravelMachine(RuleBasedStateMachine):
    make_manager: ClassVar[Callable[[], TransactionManager]]

    def __init__(self) -> None:
        super().__init__()
        self.tm = type(self).make_manager()
        # A grace of 0 before any reader leases the state row: passes need not wait.
        self.tm.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
        self.clock = Clock()
        self.skews: list[int] = [0] * (COMMITTERS + 1)  # the last one only reads
        self.catalogs: list[Catalog] = []
        #: An attempt per committer: its open transaction and the version it staged.
        self.open: dict[int, tuple[Transaction, int]] = {}
        #: T -> the version answered, or -1 for "created after T".
        self.answers: dict[int, int] = {}
        #: version -> the commit timestamp its commit returned.
        self.commit_tss: dict[int, int] = {}
        self.head = 0
        self.files = itertools.count()

    def teardown(self) -> None:
        for tx, _ in self.open.values():
            tx.abort()
        self.tm.close()

    def _fresh_catalogs(self) -> None:
        # As a gateway's catalogs: no commit timestamps recorded, history finds them.
        self.catalogs = [
            Catalog(
                self.tm,
                CATALOG,
                commit_timeout_s=10,
                commit_ts_of=self.tm.outcome_of,
                clock_ms=self.clock.skewed(skew),
            )
            for skew in self.skews
        ]

    @initialize(skews=st.lists(SKEWS, min_size=COMMITTERS, max_size=COMMITTERS))
    def create(self, skews: list[int]) -> None:
        self.skews = [*skews, 0]
        self._fresh_catalogs()
        meta = TableMeta(TABLE, '{"type":"struct","fields":[]}', (), "/nowhere", START_MS)
        commit_ts = self.catalogs[0].create(meta, job_id="create")
        assert commit_ts is not None
        self.commit_tss[0] = commit_ts

    # --- time and commits ----------------------------------------------------------

    @rule(ms=st.integers(0, 40))
    def time_passes(self, ms: int) -> None:
        self.clock.now += ms

    @precondition(lambda self: len(self.open) < COMMITTERS)
    @rule(data=st.data(), overwrite=st.booleans())
    def attempt_takes_its_log_time(self, data: st.DataObject, overwrite: bool) -> None:
        """The first half of a commit: head read, log time taken, writes buffered."""
        who = data.draw(st.sampled_from([c for c in range(COMMITTERS) if c not in self.open]))
        n = next(self.files)
        request = CommitRequest(
            OVERWRITE if overwrite else APPEND,
            (FileEntry(f"part-{n}.parquet", 1, 1),),
            f"job-{n}",
            0,
            base_version=self.head if overwrite else None,
        )
        tx = self.tm.begin()
        (staged,) = GroupAttempt(self.catalogs[who].tables, TABLE, tx).run([request])
        if isinstance(staged, ConcurrentModificationError):  # a stale overwrite base
            tx.abort()
            return
        self.open[who] = (tx, staged.version)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def attempt_commits(self, data: st.DataObject) -> None:
        """The second half: the commit point, which conflicts on the head or lands."""
        who = data.draw(st.sampled_from(sorted(self.open)))
        tx, version = self.open.pop(who)
        try:
            commit_ts = tx.commit()
        except TransactionAbortedError:
            return
        assert version == self.head + 1, f"committed version {version} after {self.head}"
        self.head = version
        self.commit_tss[version] = commit_ts

    # --- time travel, collection, forgetting ---------------------------------------

    @rule(
        reader=st.integers(0, COMMITTERS),
        when=st.sampled_from(["again", "recent", "any"]),
        back_ms=st.integers(0, 60),
        pick=st.integers(0, 1_000),
    )
    def travel(self, reader: int, when: str, back_ms: int, pick: int) -> None:
        """``version_at`` a time asked before, one just past (around the newest log
        times, where answers could change), or any time since before the table."""
        now = self.clock.now + self.skews[reader]
        asked = sorted(self.answers)
        if when == "again" and asked:
            at = asked[pick % len(asked)]
        elif when == "any":
            at = START_MS - 100 + pick * (now - START_MS + 100) // 1_000
        else:
            at = now - back_ms
        if at > now:
            return  # that reader's future: refused, no answer
        try:
            got = self.catalogs[reader].version_at(TABLE, at)
        except VersionNotFoundError as exc:
            assert "created after" in str(exc), exc
            got = -1
        before = self.answers.setdefault(at, got)
        assert got == before, f"version_at({at}) answered {before}, now {got}"

    @rule()
    def collect_garbage(self) -> None:
        """A pass at retention 0 stamps and deletes every entry below its safe point."""
        GarbageCollector(
            self.tm.store,
            timestamps=self.tm._rt.timestamps,
            locks=self.tm.locks,
            retention_s=0,
            grace_ms=0,
            config=CONFIG,
        ).run_once()

    @rule()
    def forget(self) -> None:
        """A reader in another process: no remembered outcomes, no cached metadata."""
        self.tm._rt.resolver.clear_cache()
        self._fresh_catalogs()

    # --- invariants ----------------------------------------------------------------

    @invariant()
    def answers_never_change_and_follow_the_log(self) -> None:
        if not self.catalogs:
            return
        history = self.catalogs[-1].history(TABLE)
        assert [h.record.version for h in history] == list(range(self.head + 1))
        times = [h.record.timestamp_ms for h in history]
        assert times == sorted(times), f"log times go backwards: {times}"
        for at, answer in self.answers.items():
            newest = max((v for v, ms in enumerate(times) if ms <= at), default=-1)
            assert newest == answer, (
                f"version_at({at}) answered {answer}, but the log now says {newest} "
                f"(log times {times})"
            )
        got = {h.record.version: h.commit_ts for h in history}
        assert got == self.commit_tss, "history lost or changed a commit timestamp"


SETTINGS = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _run(make: Callable[[], TransactionManager], run_settings: settings) -> None:
    class Machine(TimeTravelMachine):
        pass

    Machine.make_manager = staticmethod(make)
    run_state_machine_as_test(Machine, settings=run_settings)


def _memory() -> TransactionManager:
    return TransactionManager.embedded("memory://", config=CONFIG)


def test_time_travel_is_repeatable_on_memory() -> None:
    _run(_memory, SETTINGS)


def test_time_travel_is_repeatable_on_sqlite(tmp_path_factory: pytest.TempPathFactory) -> None:
    counter = itertools.count()

    def make() -> TransactionManager:
        folder = tmp_path_factory.mktemp(f"tt{next(counter)}")
        return TransactionManager.embedded(f"sqlite:///{folder}/store.db", config=CONFIG)

    _run(make, settings(SETTINGS, max_examples=20))


#: The broken builds only need to be found, not shrunk.
FIND_ONLY = settings(SETTINGS, max_examples=1_000, phases=[Phase.generate])


def _version_at_before_the_fix(self: History, name: str, timestamp_ms: int) -> int:
    """``version_at`` as it was: a read-only search of the log, nothing raised."""
    tables = self._tables
    if timestamp_ms > tables.clock_ms():
        raise VersionNotFoundError(f"timestamp {timestamp_ms} ms is in the future")
    with tables.tm.begin() as tx:
        return self._search_log(tx, name, tables.read_head(tx, name), timestamp_ms)


def test_time_travel_that_raises_no_log_time_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine finds the bug of issue 30, item 3, without knowing it: with the
    old ``version_at`` an answer for a time at or after the latest log time is
    contradicted by a commit whose log time was taken before the answer (or by a
    committer whose clock is behind)."""
    monkeypatch.setattr(History, "version_at", _version_at_before_the_fix)
    with pytest.raises(AssertionError, match="version_at"):
        _run(_memory, FIND_ONLY)


def test_history_without_the_stamps_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine finds the bug of issue 30, item 2, without knowing it: a history
    that looks commit timestamps up only in the transactions table loses them once a
    pass collected the entries and the reader forgot its cache."""
    find = History._find_commit_tss

    def without_stamps(
        self: History, name: str, records: dict[int, LogRecord], commit_tss: dict[int, int]
    ) -> None:
        self._stamps = None
        find(self, name, records, commit_tss)

    monkeypatch.setattr(History, "_find_commit_tss", without_stamps)
    with pytest.raises(AssertionError, match="commit timestamp"):
        _run(_memory, FIND_ONLY)
