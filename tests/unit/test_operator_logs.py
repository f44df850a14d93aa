"""What an operator reads when no leader can be had (issue 31 item 3): the cause in
the error, warnings that do not flood, and every change of leader on every replica."""

from __future__ import annotations

import logging

import pytest

from percolake.serve.replica import ControlPlane
from storage_adapters import StoreError, open_store
from tso import WARNING_INTERVAL_S, LeaderLease, RateLimitedWarning
from wire.error_codes import NoLeaderError

pytestmark = pytest.mark.unit

LEASE_MS = 1000


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_warning_is_logged_once_per_interval_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A warning repeated every round (twice a second while the store is down) is one
    line, then one line per interval counting the repeats, then one INFO line when
    the condition ends. Fails before this fix: every round logged its own line."""
    clock, logger = _Clock(), logging.getLogger("test.operator")
    warning = RateLimitedWarning(logger, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.operator"):
        for _ in range(10):
            warning.warning("store unreachable: %s", "down")
            clock.now += 0.5
        clock.now = WARNING_INTERVAL_S + 1
        warning.warning("store unreachable: %s", "down")
        warning.ended("store reachable again")
        warning.ended("store reachable again")  # said once
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.WARNING, "store unreachable: down"),
        (logging.WARNING, "store unreachable: down (9 more times since the last such line)"),
        (logging.INFO, f"store reachable again (after {WARNING_INTERVAL_S + 1:.1f} s)"),
    ]


def test_a_call_without_a_leader_names_the_unreachable_store(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose store is down fails a call after its wait for a leader with
    ``no leader for tso within ... s: store unreachable: <the store's error>``, and
    logs the unreachable store once for many rounds. Fails before this fix: the error
    said only ``no leader served a timestamp within 0 s``, and each round logged."""
    store = open_store("memory://")
    plane = ControlPlane(store, lease_ms=LEASE_MS, failover_s=0.2)
    plane.lease.address = "127.0.0.1:7071"

    def down(*args: object, **kwargs: object) -> None:
        raise StoreError("connection refused (injected)")

    with monkeypatch.context() as patched, caplog.at_level(logging.INFO):
        patched.setattr(store, "get_system", down)
        for _ in range(5):
            assert plane.lease._round()
        with pytest.raises(NoLeaderError) as caught:
            plane.next_timestamp()
    assert str(caught.value) == (
        "no leader for tso within 0.2 s: store unreachable: connection refused (injected)"
    )
    unreachable = [r for r in caplog.records if "store unreachable" in r.getMessage()]
    # One for the five rounds, one for the failed call.
    assert [r.levelno for r in unreachable] == [logging.WARNING, logging.WARNING]
    assert unreachable[0].getMessage().startswith("127.0.0.1:7071: leader lease of tso")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert plane.lease._round()  # the store is back: this replica leads
    messages = [r.getMessage() for r in caplog.records]
    assert any("store reachable again" in m for m in messages), messages
    assert plane.next_timestamp() > 0
    plane.close()


def test_every_replica_logs_each_change_of_leader_by_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A follower logs who leads when it first sees it and when that changes (a
    release), by address, and not at each renewal. Fails before this fix: only the
    replica that took the lead logged, by a random id."""
    store = open_store("memory://")
    a = LeaderLease(store, "tso", address="127.0.0.1:7071", lease_ms=LEASE_MS)
    b = LeaderLease(store, "tso", address="127.0.0.1:7072", lease_ms=LEASE_MS)
    with caplog.at_level(logging.INFO, logger="tso._lease"):
        a.step()
        b.step()
        for _ in range(3):  # renewals change the row, not who leads
            a.step()
            b.step()
        a.release()
        b.step()
    followers = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("127.0.0.1:7072")
    ]
    assert followers[:2] == [
        "127.0.0.1:7072: tso leader is now 127.0.0.1:7071, epoch 1",
        "127.0.0.1:7072: tso leader 127.0.0.1:7071 released epoch 1",
    ], followers
    b.release()


def test_a_replica_that_stepped_down_says_why_no_leader_served() -> None:
    """A replica alone on its store whose term cannot start (the oracle's bound cannot
    be taken) steps down and releases the row; a call that waited for a leader then
    names that cause, not a lease that does not reach the store. Fails before this
    fix: the error said ``holds epoch 1 but its lease is not valid (its renewals do
    not reach the store in time)``, sending the operator after the wrong problem."""
    store = open_store("memory://")
    store.put_unless_exists("_tso", b"bound", b"corrupt")
    plane = ControlPlane(store, lease_ms=LEASE_MS, failover_s=0.1)
    plane.lease.address = "127.0.0.1:7071"
    plane.lease.step()
    assert not plane.lease.valid()
    with pytest.raises(NoLeaderError) as caught:
        plane.next_timestamp()
    message = str(caught.value)
    assert message.startswith(
        "no leader for tso within 0.1 s: this replica (127.0.0.1:7071) cannot serve epoch 1: "
    ), message
    assert "renewals" not in message, message
    plane.close()
