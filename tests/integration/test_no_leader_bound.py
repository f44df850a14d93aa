"""A call with no leader to be had fails within the documented bound, naming why
(issue 31 item 3), through real ``percolake serve`` processes."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from percolake.serve.config import ServeConfig
from percolake.serve.running import upstream_timeout_s
from tests.servers import ServerProcess, sqlite_write_locked
from tso import DEFAULT_LEADER_WAIT_S
from txn import TransactionManager
from wire.error_codes import NoLeaderError

pytestmark = pytest.mark.integration

#: How long the replicas below wait for a leader (``--leader-wait-s``; 15 s by default).
_WAIT_S = 3
#: Longer than the split gateway's own deadline for its upstreams (the default 15 s
#: wait plus 5 s: it must not cut a replica's shorter wait short either), well short
#: of the five attempts of 20 s that the channel's retry policy would take.
_CLIENT_TIMEOUT_S = 40.0
#: Begins tried while the store is locked (bounded; the first that fails waits _WAIT_S).
_BEGIN_ATTEMPTS = 100


def _begin_error(address: str) -> NoLeaderError:
    client = TransactionManager.remote(address, timeout_s=_CLIENT_TIMEOUT_S)
    try:
        with pytest.raises(NoLeaderError) as caught:
            client.begin()
        return caught.value
    finally:
        client.close()


def test_begin_beside_an_embedded_oracle_fails_naming_the_cause(tmp_path: Path) -> None:
    """An embedded manager holds the store's oracle lease and serves only its own
    process; a ``percolake serve`` beside it never leads and has no leader to forward
    to. Begin, on that replica and on a split-role gateway (``serve txn``) pointed at
    it, must fail once the replica has waited for a leader (``--leader-wait-s``), with an error
    saying so and why, instead of being repeated by the client's channel.

    Fails on the code before this fix: the replica answered UNAVAILABLE after 15 s,
    the channel's retry policy sent Begin again (five attempts of 15 s), and the call
    ended at the client's own deadline (40 s here) as ``ServiceUnavailableError:
    Deadline Exceeded``, which names no cause; the split gateway's own 10 s deadline
    cut its wait short the same way. The replica logged nothing about it.
    """
    url = f"sqlite:///{tmp_path / 'store.db'}"
    embedded = TransactionManager.embedded(url)
    replica = ServerProcess("all", ["--store", url, "--leader-wait-s", str(_WAIT_S)], tmp_path)
    replica.start()
    gateway = ServerProcess(
        "txn",
        ["--store", url, "--tso", replica.address, "--locks", replica.address],
        tmp_path,
    ).start()
    try:
        with ThreadPoolExecutor(2) as pool:  # both wait out the same _WAIT_S together
            errors = list(pool.map(_begin_error, [replica.address, gateway.address]))
    finally:
        codes = [gateway.stop(), replica.stop()]
        embedded.close()
    for error in errors:
        message = str(error)
        assert message.startswith(f"no leader for tso within {_WAIT_S} s: "), message
        assert "embedded oracle" in message, message
        assert isinstance(error, ConnectionError)  # unavailable: clients may fail over
    output = replica.output()
    # Every replica logs who leads, by address (an embedded oracle has none).
    assert "tso leader is now an embedded oracle" in output, output[-3000:]
    assert f"no leader for tso within {_WAIT_S} s" in output, output[-3000:]
    assert codes == [0, 0], output[-3000:]


def test_begin_while_the_store_takes_no_writes_names_the_store(tmp_path: Path) -> None:
    """The only replica cannot renew its lease (the store refuses writes), so its
    lease runs out and no leader can be had. Begin fails once the replica waited its
    ``--leader-wait-s``, with ``no leader for tso within 3 s: store unreachable: <the store's
    error>``; the replica's rounds (16 a second with this lease) log the outage in one
    line, not one per round; once the store takes writes again Begin works.

    Fails on the code before this fix: the call ended at the client's 40 s deadline
    as "Deadline Exceeded", and every round logged its own warning.
    """
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}?busy_timeout_ms=100"
    server = ServerProcess(
        "all",
        ["--store", url, "--leader-lease-ms", "500", "--leader-wait-s", str(_WAIT_S)],
        tmp_path,
    ).start()
    client = TransactionManager.remote(server.address, timeout_s=_CLIENT_TIMEOUT_S)
    try:
        with sqlite_write_locked(path):
            # A Begin may still be served from the timestamps of the lease's last
            # moments; the next one waits for a leader.
            for _ in range(_BEGIN_ATTEMPTS):
                try:
                    client.begin().abort()
                except NoLeaderError as exc:
                    error = exc
                    break
                time.sleep(0.1)  # the lease runs out 0.45 s after its last renewal
            else:
                raise AssertionError("Begin kept being served with the store locked")
        message = str(error)
        assert message.startswith(f"no leader for tso within {_WAIT_S} s: store unreachable: "), (
            message
        )
        with client.begin() as tx:  # the store takes writes again: a leader again
            tx.put("t", b"r", b"c", b"after the outage")
    finally:
        client.close()
        server.stop()
    output = server.output()
    unreachable = [
        line
        for line in output.splitlines()
        if "WARNING" in line
        and (
            "leader row write for tso failed" in line
            or "leader lease of tso: store unreachable" in line
        )
    ]
    assert len(unreachable) == 1, "\n".join(unreachable[:20])
    assert "store reachable again" in output, output[-3000:]


@pytest.mark.parametrize("wait_s", [0.5, DEFAULT_LEADER_WAIT_S, 60.0])
def test_a_split_gateway_outwaits_its_upstreams_wait_for_a_leader(wait_s: float) -> None:
    """The split gateway's deadline for its oracle and lock server calls lies past any
    wait for a leader theirs may have: the default, whatever its own setting. Fails on
    the code before issue 31's fix, whose 10 s deadline cut a replica's 15 s wait
    short (the Begin tests above use a 3 s wait, which a 10 s deadline would not cut)."""
    config = ServeConfig(
        role="txn", tso_address="127.0.0.1:1", locks_address="127.0.0.1:2", leader_wait_s=wait_s
    )
    assert upstream_timeout_s(config) >= max(DEFAULT_LEADER_WAIT_S, wait_s) + 1
