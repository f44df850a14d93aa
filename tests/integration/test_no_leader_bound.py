"""A call with no leader to be had fails within the documented bound, naming why
(issue 31 item 3), through a real ``percolake serve``."""

from __future__ import annotations

from pathlib import Path

import pytest

from percolake.rpc import NoLeaderError
from tests.servers import ServerProcess
from txn import TransactionManager

pytestmark = pytest.mark.integration


def test_begin_beside_an_embedded_oracle_fails_naming_the_cause(tmp_path: Path) -> None:
    """An embedded manager holds the store's oracle lease and serves only its own
    process; a ``percolake serve`` beside it never leads and has no leader to forward
    to. A client's Begin must fail once the gateway has waited its 15 s for a leader,
    with an error saying so and why, instead of being repeated by the client's channel.

    Fails on the code before this fix: the gateway answered UNAVAILABLE after 15 s,
    the channel's retry policy sent Begin again (five attempts of 15 s), and the call
    ended at the client's own deadline (40 s here) as ``ServiceUnavailableError:
    Deadline Exceeded``, which names no cause. The server logged nothing about it.
    """
    url = f"sqlite:///{tmp_path / 'store.db'}"
    embedded = TransactionManager.embedded(url)
    server = ServerProcess("all", ["--store", url], tmp_path).start()
    try:
        client = TransactionManager.remote(server.address, timeout_s=40)
        with pytest.raises(NoLeaderError) as caught:
            client.begin()
        client.close()
        message = str(caught.value)
        assert message.startswith("no leader for tso within 15 s: "), message
        assert "embedded oracle" in message, message
        assert isinstance(caught.value, ConnectionError)  # unavailable, for failover
    finally:
        code = server.stop()
        embedded.close()
    output = server.output()
    # Every replica logs who leads, by address (an embedded oracle has none).
    assert "tso leader is now an embedded oracle" in output, output[-3000:]
    assert "no leader for tso within 15 s" in output, output[-3000:]
    assert code == 0, output[-3000:]
