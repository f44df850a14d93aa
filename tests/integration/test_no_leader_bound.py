"""A call with no leader to be had fails within the documented bound, naming why
(issue 31 item 3), through real ``percolake serve`` processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from percolake.rpc import NoLeaderError
from tests.servers import ServerProcess
from txn import TransactionManager

pytestmark = pytest.mark.integration

#: Longer than the 15 s a replica waits for a leader, well short of the 75 s that
#: five attempts of the channel's retry policy would take.
_CLIENT_TIMEOUT_S = 40.0


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
    it, must fail once the replica has waited its 15 s for a leader, with an error
    saying so and why, instead of being repeated by the client's channel.

    Fails on the code before this fix: the replica answered UNAVAILABLE after 15 s,
    the channel's retry policy sent Begin again (five attempts of 15 s), and the call
    ended at the client's own deadline (40 s here) as ``ServiceUnavailableError:
    Deadline Exceeded``, which names no cause; the split gateway's own 10 s deadline
    cut its wait short the same way. The replica logged nothing about it.
    """
    url = f"sqlite:///{tmp_path / 'store.db'}"
    embedded = TransactionManager.embedded(url)
    replica = ServerProcess("all", ["--store", url], tmp_path).start()
    gateway = ServerProcess(
        "txn",
        ["--store", url, "--tso", replica.address, "--locks", replica.address],
        tmp_path,
    ).start()
    try:
        with ThreadPoolExecutor(2) as pool:  # both wait out the same 15 s together
            errors = list(pool.map(_begin_error, [replica.address, gateway.address]))
    finally:
        codes = [gateway.stop(), replica.stop()]
        embedded.close()
    for error in errors:
        message = str(error)
        assert message.startswith("no leader for tso within 15 s: "), message
        assert "embedded oracle" in message, message
        assert isinstance(error, ConnectionError)  # unavailable: clients may fail over
    output = replica.output()
    # Every replica logs who leads, by address (an embedded oracle has none).
    assert "tso leader is now an embedded oracle" in output, output[-3000:]
    assert "no leader for tso within 15 s" in output, output[-3000:]
    assert codes == [0, 0], output[-3000:]
