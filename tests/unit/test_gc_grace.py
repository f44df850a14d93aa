"""The grace of garbage collection when collectors disagree on it (issue 31, rule S8).

Readers lease the ``_gc`` state row for half the grace it held when they read it. A
collector whose grace is shorter than what the row holds must wait the row's, and a
lowering of the grace is kept in the row (``lowered_from_ms``) until no lease read under
the longer grace can be valid: until then every collector, in any process, waits it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from txn import GarbageCollector, GcLoop, GcStoppedError, TransactionConfig, TransactionManager
from txn.tables import GC_TABLE, STATE_KEY, GcState, read_state

pytestmark = pytest.mark.unit

LONG_MS = 10_000


class Clock:
    """A monotonic clock that moves only when a collector sleeps (if ``advances``)."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.slept: list[float] = []
        self.advances = True

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.advances:
            self.now += seconds


@pytest.fixture
def tm() -> Iterator[TransactionManager]:
    manager = TransactionManager.embedded(
        "memory://", config=TransactionConfig(gc_publish_interval_ms=10**9)
    )
    # Readers may hold leases of LONG_MS / 2 on this row.
    manager.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=LONG_MS).encode())
    with manager.begin() as tx:
        tx.put("t", b"r", b"c", b"v")
    yield manager
    manager.close()


def _collector(tm: TransactionManager, clock: Clock, grace_ms: int) -> GarbageCollector:
    return GarbageCollector(
        tm.store,
        timestamps=tm._rt.timestamps,
        locks=tm.locks,
        retention_s=0,
        grace_ms=grace_ms,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
    )


def test_a_longer_stored_grace_is_waited_logged_and_reported(
    tm: TransactionManager, caplog: pytest.LogCaptureFixture
) -> None:
    """Fails before issue 31: the pass waited the row's 10 s silently (no log line), and
    its report did not say which grace it used."""
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="txn._gc"):
        report = _collector(tm, clock, grace_ms=200).run_once()
    assert clock.slept == [LONG_MS / 1000]
    assert (report.grace_ms, report.grace_asked_ms) == (LONG_MS, 200)
    assert "grace 10000 ms (the state row's, above the 200 ms asked)" in report.summary()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "10000 ms" in warning and "200 ms asked (--grace-ms)" in warning


def test_a_lowered_grace_binds_other_collectors_until_old_leases_ran_out(
    tm: TransactionManager,
) -> None:
    """Collector A lowers the grace from 10 s to 0 (its raise wrote the row); collector B,
    another process, raises the safe point right after. Readers that leased the row
    before A's write may hold their lease for 5 s more, so B must wait the 10 s too.
    Fails before issue 31: the row said grace 0 and B deleted at once (S8 broken for a
    reader whose lease from before A's write still showed the old safe point)."""
    a_clock, b_clock = Clock(), Clock()
    a = _collector(tm, a_clock, grace_ms=0)
    a._raise_safe_point()  # A's pass has raised the safe point, not swept yet
    state, _ = read_state(tm.store)
    assert (state.grace_ms, state.lowered_from_ms) == (0, LONG_MS)

    b_report = _collector(tm, b_clock, grace_ms=0).run_once()
    assert b_clock.slept == [LONG_MS / 1000] and b_report.grace_ms == LONG_MS
    # B's pass ran long enough after the lowering (it waited 10 s after it): it clears it.
    assert read_state(tm.store)[0].lowered_from_ms == 0
    c_clock = Clock()
    assert _collector(tm, c_clock, grace_ms=0).run_once().grace_ms == 0
    assert c_clock.slept == []  # the lowered grace now governs


def test_a_pass_that_did_not_outlast_the_old_grace_leaves_the_lowering(
    tm: TransactionManager,
) -> None:
    """The lowering is cleared only by a pass that ran at least the old grace after the
    lowering was written, by its own clock; one that did not (its sleep returned at
    once, here) leaves it, and the next collector still waits the old grace."""
    quick = Clock()
    quick.advances = False
    _collector(tm, quick, grace_ms=0).run_once()
    assert read_state(tm.store)[0].lowered_from_ms == LONG_MS
    later = Clock()
    assert _collector(tm, later, grace_ms=0).run_once().grace_ms == LONG_MS
    assert later.slept == [LONG_MS / 1000]


def test_a_longer_grace_asked_replaces_a_lowering() -> None:
    """A collector whose grace covers every lease (at least the grace lowered from)
    writes its own and drops the lowering: nothing longer can be leased from then on."""
    with TransactionManager.embedded("memory://") as manager:
        lowered = GcState(grace_ms=0, lowered_from_ms=LONG_MS, lowering="x")
        manager.store.put_unless_exists(GC_TABLE, STATE_KEY, lowered.encode())
        with manager.begin() as tx:
            tx.put("t", b"r", b"c", b"v")
        clock = Clock()
        report = _collector(manager, clock, grace_ms=2 * LONG_MS).run_once()
        state, _ = read_state(manager.store)
        assert (state.grace_ms, state.lowered_from_ms, state.lowering) == (2 * LONG_MS, 0, "")
        assert report.grace_ms == 2 * LONG_MS and report.grace_asked_ms is None


def test_closing_the_loop_ends_a_pass_waiting_its_grace_and_deletes_nothing(
    tm: TransactionManager,
) -> None:
    """A stopping server used to wait out a pass's grace (10 s here) before its GC
    thread let it go. Now ``GcLoop.close`` ends the wait: the pass stops with
    ``GcStoppedError`` before sweeping anything, and a later collector still waits the
    grace (the safe point it published keeps its time in the row, rule S8)."""
    with tm.begin() as tx:
        tx.put("t", b"r", b"c", b"v2")  # v becomes a collectable old version
    collector = GarbageCollector(
        tm.store, timestamps=tm._rt.timestamps, locks=tm.locks, retention_s=0, grace_ms=LONG_MS
    )
    loop = GcLoop(collector, interval_s=0.01)
    deadline = time.monotonic() + 30
    while read_state(tm.store)[0].safe_point == 0:  # the pass published, now waits
        assert time.monotonic() < deadline, "the pass never published a safe point"
        time.sleep(0.01)
    loop.close()
    assert not loop._thread.is_alive()  # close() joins for up to 60 s: it did not wait
    assert loop.passes == 0 and loop.last is None
    with pytest.raises(GcStoppedError):
        collector.run_once()  # a stopped collector starts no pass
    (versions,) = tm.store.get_versions("t", [(b"r", b"c")]).values()
    assert len(versions) == 2  # nothing swept
    clock = Clock()
    _collector(tm, clock, grace_ms=0).run_once()
    assert clock.slept and clock.slept[0] > 0  # the next pass waits the grace's remainder
