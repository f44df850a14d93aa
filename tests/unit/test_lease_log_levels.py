"""How a replica's end of term reads in its log (issue 31, item 6): a deliberate release
is INFO, an end the operator must look into stays a WARNING, and the replica is named by
the address it serves on."""

from __future__ import annotations

import logging

import pytest

from percolake.serve.replica import ControlPlane
from storage_adapters import StoreError, open_store
from tso import LeaderLease

pytestmark = pytest.mark.unit

LEASE_MS = 1000


def test_a_release_is_info_and_a_lost_term_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Fails before issue 31: a clean shutdown logged
    ``replica <random id> stops leading tso (epoch 1): released`` as a WARNING."""
    store = open_store("memory://")
    lease = LeaderLease(store, "tso", address="127.0.0.1:7071", lease_ms=LEASE_MS)
    with caplog.at_level(logging.INFO, logger="tso._lease"):
        lease.step()
        assert lease.valid()
        lease.release()
    (ended,) = [r for r in caplog.records if "stops leading" in r.getMessage()]
    assert ended.levelno == logging.INFO
    assert ended.getMessage() == "127.0.0.1:7071 stops leading tso (epoch 1): released"

    caplog.clear()
    other = LeaderLease(store, "tso", address="127.0.0.1:7072", lease_ms=LEASE_MS)
    with caplog.at_level(logging.INFO, logger="tso._lease"):
        other.step()  # takes the released row at once: epoch 2
        assert other.valid()
        other._end_term("the leader row changed: deposed")  # as a round finding it gone
    (lost,) = [r for r in caplog.records if "stops leading" in r.getMessage()]
    assert lost.levelno == logging.WARNING
    assert lost.getMessage().startswith("127.0.0.1:7072 stops leading tso (epoch 2)")
    other.release()


def test_a_failed_first_round_names_the_replica_by_address(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before issue 31: the line named no replica ('first leader election round
    failed: ...'), so among three replicas' logs it could not be told whose it was."""
    store = open_store("memory://")
    plane = ControlPlane(store, lease_ms=LEASE_MS, failover_s=0.2)

    def down(*args: object, **kwargs: object) -> None:
        raise StoreError("connection refused (injected)")

    monkeypatch.setattr(store, "get_system", down)
    with caplog.at_level(logging.WARNING, logger="percolake.serve.replica"):
        plane.start("127.0.0.1:7073")
    plane.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "percolake.serve.replica"]
    assert messages[0] == (
        "127.0.0.1:7073: first leader election round failed: connection refused (injected)"
    ), messages
