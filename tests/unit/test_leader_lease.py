"""Leader leases (rule S7 with replicas): :mod:`tso._lease`, on fake clocks.

Every replica has its own clock, running at its own rate; real time is what the test
advances. The property at the end checks the rule itself: at no real instant do two
replicas consider themselves leader, whatever the interleaving of their rounds, pauses
and clock rates within the drift margin. A variant without the margin is caught.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from percolake.serve.replica import ControlPlane
from storage_adapters import Claim, KVStore, open_store
from tso import (
    DRIFT_MARGIN,
    LEADER_TABLE,
    ORACLE_ROLE,
    LeaderLease,
    LeaseRecord,
    OracleAlreadyRunningError,
    TimestampOracle,
    _lease,
)
from wire.errors import OracleFencedError

pytestmark = pytest.mark.unit

LEASE_MS = 1000


class World:
    """Real time, and replicas whose clocks run at their own rates."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self, rate: float = 1.0, offset: float = 0.0) -> _Clock:
        return _Clock(self, rate, offset)


class _Clock:
    def __init__(self, world: World, rate: float, offset: float) -> None:
        self.world, self.rate, self.offset = world, rate, offset

    def __call__(self) -> float:
        return self.offset + self.world.now * self.rate


def _replica(store: KVStore, world: World, rate: float = 1.0) -> LeaderLease:
    return LeaderLease(store, "tso", address=f"r{rate}", lease_ms=LEASE_MS, clock=world.clock(rate))


def test_the_first_replica_on_a_fresh_store_leads_at_once() -> None:
    world, store = World(), open_store("memory://")
    a = _replica(store, world)
    a.step()
    assert a.valid() and a.epoch == 1
    record = LeaseRecord.decode(store.get_system(LEADER_TABLE, [b"tso"])[b"tso"])
    assert (record.holder, record.address, record.epoch) == (a.id, "r1.0", 1)


def test_a_follower_takes_over_only_after_waiting_out_the_lease_it_saw_last() -> None:
    world, store = World(), open_store("memory://")
    a, b = _replica(store, world), _replica(store, world)
    a.step()
    b.step()
    assert not b.valid() and b.leader_address() == "r1.0"
    for _ in range(20):  # a renews: b never takes over
        world.now += 0.25
        a.step()
        b.step()
        assert a.valid() and not b.valid()
    # a dies: b waits the lease plus the margin from its last sight of a renewal.
    last_seen = world.now
    while not b.valid():
        world.now += 0.01
        b.step()
    assert world.now - last_seen >= LEASE_MS / 1000 * (1 + DRIFT_MARGIN) - 1e-9
    assert b.epoch == 2
    # a's lease ran out long before, by its own clock.
    assert not a.valid()


def test_a_leader_is_valid_until_its_renewal_send_time_plus_the_lease_minus_the_margin() -> None:
    world, store = World(), open_store("memory://")
    a = _replica(store, world)
    a.step()
    world.now += LEASE_MS / 1000 * (1 - DRIFT_MARGIN) - 0.001
    assert a.valid()
    world.now += 0.002  # a pause: no renewal in between
    assert not a.valid()


def test_an_oracle_refuses_to_serve_once_its_lease_ran_out_and_its_term_ended() -> None:
    world, store = World(), open_store("memory://")
    a = _replica(store, world)
    a.step()
    oracle = TimestampOracle(store, lease=a)
    first = oracle.next_timestamp()
    world.now += 5  # paused past its lease
    with pytest.raises(OracleFencedError, match="lease ran out"):
        oracle.next_timestamp()
    b = _replica(store, world)
    b.step()
    world.now += 2
    b.step()
    assert b.valid()
    after = TimestampOracle(store, lease=b).next_timestamp()
    assert after > first
    a.step()  # a wakes up: its renewal fails, its term is over for good
    assert not a.valid()
    with pytest.raises(OracleFencedError):
        oracle.next_timestamp()


def test_a_released_lease_is_taken_over_at_once() -> None:
    world, store = World(), open_store("memory://")
    a, b = _replica(store, world), _replica(store, world)
    a.step()
    b.step()
    a.release()
    assert not a.valid()
    b.step()
    assert b.valid() and b.epoch == 2


def test_a_deposed_leader_stops_at_its_next_renewal_and_the_lease_is_waited_out() -> None:
    world, store = World(), open_store("memory://")
    a, b = _replica(store, world), _replica(store, world)
    a.step()
    b.step()
    assert b.depose("cannot reach it")
    deposed_at = world.now
    world.now += 0.1
    assert a.valid()  # until its next round
    a.step()
    assert not a.valid()
    while not b.valid():
        world.now += 0.05
        a.step()
        b.step()
        assert not a.valid()  # a sits out: it was deposed for being unreachable
    assert world.now - deposed_at >= LEASE_MS / 1000 * (1 + DRIFT_MARGIN) - 1e-9


def test_a_corrupt_leader_row_is_reported() -> None:
    store = open_store("memory://")
    store.put_unless_exists(LEADER_TABLE, b"tso", b"{not json")
    with pytest.raises(Exception, match="corrupt leader row"):
        LeaderLease(store, "tso").step()


def test_bad_lease_lengths_are_refused() -> None:
    store = open_store("memory://")
    with pytest.raises(ValueError, match="leader lease"):
        LeaderLease(store, lease_ms=10)
    with pytest.raises(TypeError):
        LeaderLease(store, lease_ms=1.5)  # type: ignore[arg-type]


# --- the rule itself, under any interleaving -----------------------------------------

#: Clock rates within the tolerated drift (both ways from 1, so relative drift up to
#: about 9 %), and a few rounds of each replica in any order, with pauses.
_rates = st.floats(min_value=1 - DRIFT_MARGIN * 0.45, max_value=1 + DRIFT_MARGIN * 0.45)
_events = st.lists(
    st.tuples(st.integers(0, 2), st.floats(min_value=0.0, max_value=1.5)),
    min_size=5,
    max_size=80,
)


def _never_two_leaders(rates: list[float], events: list[tuple[int, float]]) -> None:
    world, store = World(), open_store("memory://")
    replicas = [_replica(store, world, rate) for rate in rates]
    for who, pause in events:
        world.now += pause
        leading = [r for r in replicas if r.valid()]
        assert len(leading) <= 1, f"two leaders at {world.now:.3f}: {leading}"
        replicas[who].step()
        leading = [r for r in replicas if r.valid()]
        assert len(leading) <= 1, f"two leaders at {world.now:.3f}"


@settings(max_examples=300, deadline=None)
@given(rates=st.lists(_rates, min_size=3, max_size=3), events=_events)
def test_no_two_replicas_ever_lead_at_the_same_instant(
    rates: list[float], events: list[tuple[int, float]]
) -> None:
    _never_two_leaders(rates, events)


def test_without_the_drift_margin_two_leaders_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check on a broken build (no margin): a follower whose clock runs fast
    takes over while the slow leader still counts its lease as valid."""
    monkeypatch.setattr(_lease, "DRIFT_MARGIN", 0.0)
    with pytest.raises(AssertionError, match="two leaders"):
        # The leader's clock runs 4 % slow, the follower's 4 % fast.
        _never_two_leaders([0.96, 1.04, 1.0], [(0, 0.0), (1, 0.0), (1, 1.0), (1, 0.02)])


def test_an_embedded_oracle_whose_claim_another_now_holds_is_not_waited_out(
    tmp_path: Path,
) -> None:
    """An embedded oracle on SQLite also holds the file's claim: once another process
    holds that claim, the old one serves nothing (it checks its claim at every hand-out),
    so its lease need not be waited out. A replica without the claim still waits."""
    url = f"sqlite:///{tmp_path}/s.db"
    first_store = open_store(url)
    first = TimestampOracle(first_store)
    served = first.next_timestamp()
    first_store.close()  # as a crash: the claim goes, the lease row stays held
    second_store = open_store(url)
    replica = LeaderLease(second_store, "tso")
    replica.step()
    assert not replica.valid()  # it cannot know the holder stopped: it waits
    started = time.monotonic()
    second = TimestampOracle(second_store)
    assert time.monotonic() - started < 1.0
    assert second.next_timestamp() > served
    with pytest.raises(OracleFencedError):
        first.next_timestamp()
    second.close()
    second_store.close()


# --- issue 30: claims that prove the holder gone, and terms no one can serve ---------


def _sqlite_replica(url: str, world: World, rate: float = 1.0) -> LeaderLease:
    """A replica of ``percolake serve`` on SQLite: it claims the oracle role per term."""
    return LeaderLease(
        open_store(url),
        "tso",
        address=f"r{rate}",
        lease_ms=LEASE_MS,
        clock=world.clock(rate),
        claim_role=ORACLE_ROLE,
    )


def test_a_replica_restarted_after_a_crash_takes_over_at_once_when_the_claim_proves_it(
    tmp_path: Path,
) -> None:
    """Fails before the fix (issue 30, item 10): replicas of ``percolake serve`` held no
    claim, so a restart after ``kill -9`` of the only replica waited out the dead
    leader's lease (2.2 s) although the SQLite claim could prove the holder dead. Now
    the leader holds the store's ``oracle`` claim for its term and marks its row
    ``claimed``; a restarted replica that gets the claim takes over at once. A replica
    that cannot get it (the leader lives) waits, then leads without it."""
    world, url = World(), f"sqlite:///{tmp_path}/s.db"
    first = _sqlite_replica(url, world)
    first.step()
    assert first.valid() and _row(first).claimed
    alive = _sqlite_replica(url, world)  # the leader lives: no proof, it waits
    alive.step()
    assert not alive.valid()
    first._store.close()  # kill -9: the OS drops its locks; the row stays held
    restarted = _sqlite_replica(url, world)
    restarted.step()
    assert restarted.valid() and restarted.epoch == 2 and _row(restarted).claimed
    world.now += 0.5
    alive.step()  # saw the new row: waits again
    assert not alive.valid()


def test_a_follower_that_waited_out_the_lease_leads_without_the_claim_and_its_crash_is_waited_out(
    tmp_path: Path,
) -> None:
    """A leader paused (SIGSTOP) keeps its claim: the follower waits out the lease and
    leads with ``claimed`` false; after it dies, the next one must wait too, because
    nothing proves it gone (the claim it never had is free)."""
    world, url = World(), f"sqlite:///{tmp_path}/s.db"
    paused, follower = _sqlite_replica(url, world), _sqlite_replica(url, world)
    paused.step()
    follower.step()
    world.now += LEASE_MS / 1000 * (1 + DRIFT_MARGIN) + 0.01
    follower.step()
    assert follower.valid() and not _row(follower).claimed
    assert not paused.valid()
    follower._store.close()  # dies
    third = _sqlite_replica(url, world)
    third.step()
    assert not third.valid()  # the claim is free, but the row does not say claimed


def _row(lease: LeaderLease) -> LeaseRecord:
    raw = lease._store.get_system(LEADER_TABLE, [b"tso"])[b"tso"]
    return LeaseRecord.decode(raw)


class _Embedded(TimestampOracle):
    """An embedded oracle (claim, own lease, :meth:`TimestampOracle._on_term`) whose lease
    runs on a fake clock and is stepped by the test instead of a thread."""

    def __init__(self, store: KVStore, clock: _Clock) -> None:
        self._test_clock = clock
        super().__init__(store)

    def _lead_alone(self, store: KVStore, claim: Claim, lease_ms: int | None = None) -> LeaderLease:
        lease = LeaderLease(
            store,
            "tso",
            claim=claim,
            on_change=self._on_term,
            lease_ms=LEASE_MS,
            clock=self._test_clock,
        )
        if not lease.acquire(timeout_s=0):
            lease.release()
            raise OracleAlreadyRunningError("another leads", where="row", holder=None)
        return lease

    @property
    def lease(self) -> LeaderLease:
        assert self._own_lease is not None
        return self._own_lease


def test_an_embedded_oracle_that_takes_the_row_again_serves_the_new_term() -> None:
    """Fails before the fix (issue 30, item 13). Embedded E leads (epoch 1); E is
    paused, replica R waits out the lease and takes over (epoch 2) and serves; E
    resumes, its term ends and its oracle refuses; R dies. E's lease thread waits out
    R's lease and takes the row (epoch 3) and renews it forever, but E's oracle was
    built for epoch 1 and refused every timestamp (``OracleFencedError``), while no
    replica could take over and none had anywhere to forward: no timestamps anywhere.
    Now E's oracle takes the bound afresh in its new term and serves above R."""
    world, store = World(), open_store("memory://")
    embedded = _Embedded(store, world.clock())
    served = [embedded.next_timestamp()]
    replica = _replica(store, world)
    replica.step()
    world.now += LEASE_MS / 1000 * (1 + DRIFT_MARGIN) + 0.01  # E is paused
    replica.step()
    assert replica.valid() and replica.epoch == 2
    served.append(TimestampOracle(store, lease=replica).next_timestamp())
    with pytest.raises(OracleFencedError):  # E wakes up: its lease ran out
        embedded.next_timestamp()
    embedded.lease.step()  # and it learns that R leads
    assert not embedded.lease.valid()
    # R dies. E waits out R's lease, takes the row, and serves its new term.
    for _ in range(100):
        world.now += 0.1
        embedded.lease.step()
        if embedded.lease.valid():
            break
    assert embedded.lease.valid() and embedded.lease.epoch == 3
    served.append(embedded.next_timestamp())
    assert served == sorted(served) and len(set(served)) == 3


def test_a_replica_that_cannot_take_the_bound_steps_down_instead_of_holding_the_row() -> None:
    """Fails before the fix (issue 30, item 13, the replica's side): a replica whose
    oracle could not take over the bound at the start of its term logged the error
    and kept renewing the row, serving nothing, so no other replica could take over.
    Now it releases the row (it served nothing in that term) and another replica
    takes over at once."""
    world, store = World(), open_store("memory://")
    store.put_unless_exists("_tso", b"bound", b"corrupt")
    plane = ControlPlane(store, lease_ms=LEASE_MS)
    plane.lease._clock = world.clock()
    plane.lease.address = "127.0.0.1:1"
    plane.lease.step()
    assert not plane.lease.valid()
    row = LeaseRecord.decode(store.get_system(LEADER_TABLE, [b"tso"])[b"tso"])
    assert row.released and row.holder == plane.lease.id
    store.compare_and_set("_tso", b"bound", b"corrupt", b"5 repaired")
    other = _replica(store, world)
    other.step()  # no wait: the row was released
    assert other.valid() and other.epoch == 2
    assert TimestampOracle(store, lease=other).next_timestamp() >= 5
    plane.close()


# --- the rule with claims: processes reaching one SQLite file by different paths, ------
# --- embedded oracles beside replicas, pauses, deaths and restarts -------------------

#: How a process names the database: the file, a symlink to it, a path through a
#: symlinked folder. (Hard links need separate processes, SQLite refuses two names of
#: one file in one process; ``test_oracle_claim.py`` covers them.)
_PATHS = ("dir/store.db", "link.db", "dir-link/store.db")


class _Process:
    """One process of the model: a replica of ``percolake serve`` (a claim per term, an
    oracle per term, as :class:`percolake.serve.replica.ControlPlane` builds them) or an
    embedded oracle (a claim for life, its own lease, :class:`_Embedded`)."""

    def __init__(self, root: Path, path: str, world: World, rate: float, embedded: bool) -> None:
        self.store = open_store(f"sqlite:///{root / path}")
        self.embedded: _Embedded | None = None
        self.term_oracle: TimestampOracle | None = None
        clock = world.clock(rate)
        if embedded:
            try:
                self.embedded = _Embedded(self.store, clock)
            except OracleAlreadyRunningError:
                self.store.close()
                raise
            self.lease = self.embedded.lease
        else:
            self.lease = LeaderLease(
                self.store,
                "tso",
                address=f"{path}@{rate:.3f}",
                lease_ms=LEASE_MS,
                clock=clock,
                claim_role=ORACLE_ROLE,
                on_change=self._on_change,
            )

    def _on_change(self, epoch: int | None) -> None:
        if self.term_oracle is not None:
            self.term_oracle.close()
            self.term_oracle = None
        if epoch is not None:
            self.term_oracle = TimestampOracle(self.store, lease=self.lease)

    def timestamp(self) -> int:
        oracle = self.embedded or self.term_oracle
        if oracle is None:
            raise OracleFencedError("no term")
        return oracle.next_timestamp()

    def kill(self) -> None:
        self.store.close()  # the OS drops its locks; nothing else happens


_process_events = st.lists(
    st.tuples(
        st.integers(0, 2),  # which process slot (a tick starts its rounds from it)
        st.sampled_from(
            ["tick", "tick", "tick", "pause", "kill", "start-replica", "start-embedded"]
        ),
        st.sampled_from(_PATHS),
        st.floats(min_value=0.0, max_value=1.5),  # real time passing before it
    ),
    min_size=5,
    max_size=40,
)


def _claims_and_terms_hold(
    rates: list[float], events: list[tuple[int, str, str, float]], root: Path
) -> None:
    """``tick``: time passes, then every live process that is not paused runs a round
    (from ``slot`` on, in turn); ``pause``: ``slot`` runs no round for twice the time
    given; ``kill``: it dies; ``start-*``: a new process in an empty slot."""
    (root / "dir").mkdir()
    os.symlink(root / "dir" / "store.db", root / "link.db")
    os.symlink(root / "dir", root / "dir-link")
    world = World()
    slots: list[_Process | None] = [None, None, None]
    paused_until = [0.0, 0.0, 0.0]
    handed_out: list[int] = []

    def check(when: str) -> None:
        live = [p for p in slots if p is not None]
        leading = [p for p in live if p.lease.valid()]
        assert len(leading) <= 1, f"two leaders {when} at {world.now:.3f}"
        for process in live:
            try:
                ts = process.timestamp()
            except OracleFencedError:
                # Only a process that does not lead may refuse: a leader that cannot
                # serve its term squats on the row (issue 30, item 13).
                assert not process.lease.valid(), f"a leader refused {when} at {world.now:.3f}"
                continue
            # S7: every hand-out above every earlier one, whoever handed it out.
            assert not handed_out or ts > handed_out[-1], f"{ts} after {handed_out[-1]} {when}"
            handed_out.append(ts)

    try:
        for slot, action, path, dt in events:
            if action == "tick":
                world.now += dt
                check("after a pause")
                for i in (slot, (slot + 1) % 3, (slot + 2) % 3):
                    process = slots[i]
                    if process is not None and world.now >= paused_until[i]:
                        process.lease.step()
                        check(f"after a round of {i}")
            elif action == "pause":
                paused_until[slot] = world.now + 2 * dt
            elif action == "kill" and (process := slots[slot]) is not None:
                process.kill()
                slots[slot] = None
                check(f"after the death of {slot}")
            elif action.startswith("start") and slots[slot] is None:
                embedded = action == "start-embedded"
                # Refused when a replica leads, or another embedded oracle holds the claim.
                with contextlib.suppress(OracleAlreadyRunningError):
                    slots[slot] = _Process(root, path, world, rates[slot], embedded)
                paused_until[slot] = 0.0
                check(f"after {action} of {slot}")
    finally:
        for process in slots:
            if process is not None:
                process.kill()


@settings(max_examples=100, deadline=None)
@given(rates=st.lists(_rates, min_size=3, max_size=3), events=_process_events)
def test_claims_prove_holders_gone_and_leaders_serve_their_terms(
    rates: list[float], events: list[tuple[int, str, str, float]]
) -> None:
    """Processes reach one SQLite file by different paths; each is a replica or an
    embedded oracle; they step, pause (real time passes without their rounds), die
    (their OS locks go) and start again in any order, clock rates within the margin.
    At no instant do two lead, every timestamp handed out is above every earlier one,
    and a process that leads serves (it does not hold the row while refusing).
    Before the fixes of issue 30 this finds a second oracle through a symlink taking
    over at once beside a live one (item 12), and an embedded oracle that took the row
    again and refused every call (item 13)."""
    with tempfile.TemporaryDirectory(prefix="lease-paths-") as tmp:
        _claims_and_terms_hold(rates, events, Path(tmp))


def test_the_path_model_catches_a_claim_named_from_the_path_as_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same check on the broken claim (item 12): a lock file per path, nothing on
    the database file. An embedded oracle through ``link.db`` takes the claim beside a
    live one on ``dir/store.db``, reads its row as proof that the first is gone and
    leads beside it."""
    from storage_adapters import sqlite

    monkeypatch.setattr(sqlite.SQLiteStore, "_lock_database_byte", lambda self, role: None)
    monkeypatch.setattr(
        sqlite.SQLiteStore,
        "claim_file",
        lambda self, role: f"{os.path.abspath(self.path)}.{role}.lock",
    )
    with pytest.raises(AssertionError, match="two leaders"):
        _claims_and_terms_hold(
            [1.0, 1.0, 1.0],
            [
                (0, "start-embedded", "dir/store.db", 0.0),
                (1, "start-embedded", "link.db", 0.0),
            ],
            tmp_path,
        )


def test_the_path_model_catches_an_embedded_oracle_that_squats_on_its_next_term(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same check on the broken embedded oracle (item 13): it takes the bound in its
    first term only. Paused, it loses the row to a replica; the replica dies; the
    embedded oracle takes the row again and refuses every call while it leads."""

    def first_term_only(self: TimestampOracle, epoch: int | None) -> None:
        if epoch is not None and self._term is None:
            self._next, self._bound = self._take_over()
            self._term = epoch

    monkeypatch.setattr(TimestampOracle, "_on_term", first_term_only)
    with pytest.raises(AssertionError, match="a leader refused"):
        _claims_and_terms_hold(
            [1.0, 1.0, 1.0],
            [
                (0, "start-embedded", "dir/store.db", 0.0),
                (1, "start-replica", "link.db", 0.0),
                (0, "pause", "link.db", 1.5),  # the embedded one: until t = 3
                (1, "tick", "link.db", 0.5),  # the replica sees the row
                (1, "tick", "link.db", 1.2),  # and takes over from the paused one
                (1, "tick", "link.db", 1.4),  # the embedded one wakes: its term ended
                (1, "kill", "link.db", 0.0),
                (0, "tick", "link.db", 1.2),  # it takes the row again: epoch 3
            ],
            tmp_path,
        )
