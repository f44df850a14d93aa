"""The executor side of ``write_cells``, run in-process against a stand-in remote manager.

The real path (tasks attaching over gRPC) is tested once the gateway exists; here
``TransactionManager.remote(...).attach(id)`` hands back the driver's transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import Row

from spark_integration.spark.cells import PartitionWriter, encode_row_key, encode_value
from txn import Transaction, TransactionManager

pytestmark = pytest.mark.unit


class StandInRemote:
    """What a task sees: ``attach`` returns the open transaction with that id."""

    def __init__(self, open_transactions: dict[str, Transaction], log: list[str]) -> None:
        self._open = open_transactions
        self._log = log

    def attach(self, txn_id: str) -> Transaction:
        self._log.append(f"attach {txn_id}")
        return self._open[txn_id]

    def close(self) -> None:
        self._log.append("close")


@pytest.fixture
def tm() -> Iterator[TransactionManager]:
    manager = TransactionManager.embedded("memory://")
    yield manager
    manager.close()


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Transaction], list[str]]:
    open_transactions: dict[str, Transaction] = {}
    log: list[str] = []

    def fake_remote(cls: Any, address: str, token: str | None = None) -> StandInRemote:
        log.append(f"remote {address} {token}")
        return StandInRemote(open_transactions, log)

    monkeypatch.setattr(TransactionManager, "remote", classmethod(fake_remote))
    return open_transactions, log


def test_tasks_write_into_the_drivers_transaction(
    tm: TransactionManager, remote: tuple[dict[str, Transaction], list[str]]
) -> None:
    open_transactions, log = remote
    with tm.begin() as tx:
        tx.put("cells", b"2", b"score", b"old")
    tx = tm.begin()
    open_transactions[tx.id] = tx
    writer = PartitionWriter(
        "gw:7070", "secret", tx.id, "cells", "id", ("name", "score"), encode_value
    )
    writer([Row(id=1, name="ann", score=3.5), Row(id=2, name="bob", score=None)])
    writer([Row(id="k", name=b"\x00raw", score=True)])
    assert log == [
        "remote gw:7070 secret",
        f"attach {tx.id}",
        "close",
        "remote gw:7070 secret",
        f"attach {tx.id}",
        "close",
    ]
    # Nothing is visible before the driver commits.
    with tm.begin() as reader:
        assert reader.get("cells", b"1", b"name") is None
    tx.commit()
    with tm.begin() as reader:
        assert sorted(reader.scan("cells")) == [
            (b"1", b"name", b"ann"),
            (b"1", b"score", b"3.5"),
            (b"2", b"name", b"bob"),
            (b"k", b"name", b"\x00raw"),
            (b"k", b"score", b"true"),
        ]


def test_row_keys_and_values_are_encoded_plainly() -> None:
    assert encode_row_key("a") == b"a"
    assert encode_row_key(12) == b"12"
    assert encode_row_key(b"\x01") == b"\x01"
    with pytest.raises(TypeError):
        encode_row_key(1.5)
    with pytest.raises(ValueError):
        encode_row_key("")
    assert encode_value(None) is None
    assert encode_value("é") == "é".encode()
    assert encode_value(7) == b"7"
    assert encode_value({"b": 1, "a": [1]}) == b'{"a": [1], "b": 1}'
