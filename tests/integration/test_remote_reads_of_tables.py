"""``get_many_of_tables`` through a gateway (issue 27): a remote transaction reads each
table with one ``GetMany``, and answers exactly as ``get_many`` of each table does, its
own unflushed writes included. (Embedded managers: tests/contract/test_reads_of_tables_at_once.py.)
"""

from __future__ import annotations

import pytest

from tests.servers import ServerProcess
from txn import TransactionManager

pytestmark = pytest.mark.integration


def test_a_remote_transaction_reads_several_tables_as_it_reads_each(
    sqlite_gateway: ServerProcess,
) -> None:
    tm = TransactionManager.remote(sqlite_gateway.address)
    try:
        with tm.begin() as tx:
            tx.put("rh", b"t", b"c", b"h1")
            tx.put("rm", b"j1", b"c", b"1")
            tx.put("rm", b"j2", b"c", b"2")
            tx.commit()
        with tm.begin() as tx:
            tx.put("rm", b"own", b"c", b"mine")  # buffered, not yet sent
            tx.delete("rm", b"j2", b"c")
            reads = [
                ("rh", [(b"t", b"c"), (b"absent", b"c")]),
                ("rm", [(b"j1", b"c"), (b"j2", b"c"), (b"own", b"c")]),
            ]
            got = tx.get_many_of_tables(reads)
            assert got == [tx.get_many(table, cells) for table, cells in reads]
            assert got == [{(b"t", b"c"): b"h1"}, {(b"j1", b"c"): b"1", (b"own", b"c"): b"mine"}]
            assert tx.get_many_of_tables([]) == []
            with pytest.raises(TypeError, match="pair"):
                tx.get_many_of_tables([("rh",)])  # type: ignore[list-item]
            tx.abort()
    finally:
        tm.close()
