"""Replicas of ``percolake serve`` on one store (rule S7 with leader leases), through
real processes: one leads and serves timestamps and locks, the others forward to it;
a killed or paused leader is replaced, and clients given every replica's address fail
over by themselves.

The lease protocol on fake clocks, with the property that no two replicas ever lead
at once, is in ``tests/unit/test_leader_lease.py``; the chaos runs with leader kills,
pauses and partitions and the timestamp workload are in ``tests/chaos``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage_adapters import open_store
from tests.servers import ServerProcess, pause_outside_sqlite_writes
from tso import LEADER_TABLE, LeaseRecord
from txn import TransactionManager
from txn.errors import TransactionAbortedError
from txn.remote import RemoteTransactionManager

pytestmark = pytest.mark.integration

#: Short leases keep the tests quick; the defaults are measured in the benchmarks.
LEASE = ["--leader-lease-ms", "1000"]


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


def _leader(url: str) -> LeaseRecord:
    store = open_store(url)
    try:
        return LeaseRecord.decode(store.get_system(LEADER_TABLE, [b"tso"])[b"tso"])
    finally:
        store.close()


def _commit(client: RemoteTransactionManager, value: bytes, served: list[int]) -> None:
    """Commit ``value``; a transaction aborted by a failover (its locks were in the old
    leader's table, rule S5) is begun again, as an application would."""
    for _ in range(5):
        try:
            with client.begin() as tx:
                start_ts = tx.start_ts
                tx.put("t", b"r", b"c", value)
        except TransactionAbortedError:
            continue
        assert tx.commit_ts is not None
        served += [start_ts, tx.commit_ts]
        return
    raise AssertionError("five transactions in a row aborted")


def test_a_second_serve_on_the_store_is_a_replica_and_a_restart_serves_above(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """Before leases the second ``percolake serve`` had to exit (a file lock); now it is
    a replica: it forwards to the leader, every timestamp stays above the ones before,
    and after the leader is killed the follower leads and serves above them all."""
    store = ["--store", _url(tmp_path), *LEASE]
    first = ServerProcess("all", store, tmp_path).start()
    servers.append(first)
    served: list[int] = []
    client = TransactionManager.remote(first.address)
    for i in range(5):
        _commit(client, b"%d" % i, served)
    second = ServerProcess("all", store, tmp_path).start()
    servers.append(second)
    oracle_only = ServerProcess("tso", store, tmp_path).start()
    servers.append(oracle_only)
    assert _leader(_url(tmp_path)).address == first.address
    via_second = TransactionManager.remote(second.address)
    for i in range(5, 10):  # interleaved through both: one order of timestamps
        _commit(via_second if i % 2 else client, b"%d" % i, served)
    assert served == sorted(served) and len(set(served)) == len(served)
    assert "leads tso" not in second.output()

    first.kill()
    client.close()
    started = time.monotonic()
    _commit(via_second, b"after", served)
    assert time.monotonic() - started < 10
    assert served == sorted(served)
    assert _leader(_url(tmp_path)).address in (second.address, oracle_only.address)
    via_second.close()


def test_clients_of_every_replica_fail_over_when_the_leader_is_killed_or_paused(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    store = ["--store", _url(tmp_path), *LEASE]
    replicas = [ServerProcess("all", store, tmp_path).start() for _ in range(3)]
    servers.extend(replicas)
    client = TransactionManager.remote(",".join(r.address for r in replicas), timeout_s=20)
    served: list[int] = []
    _commit(client, b"0", served)
    by_address = {r.address: r for r in replicas}

    for fault, value in ((signal.SIGSTOP, b"paused"), (signal.SIGKILL, b"killed")):
        leader = by_address[_leader(_url(tmp_path)).address]
        epoch = _leader(_url(tmp_path)).epoch
        if fault == signal.SIGSTOP:
            # Not inside a store write: on SQLite that would hold the write lock, and no
            # replica could take over until SIGCONT (a known limit, measured in bench_ha).
            pause_outside_sqlite_writes(leader, tmp_path / "store.db")
        else:
            leader.signal(fault)
        started = time.monotonic()
        _commit(client, value, served)  # no error: waits for the new leader
        outage = time.monotonic() - started
        assert outage < 10, outage
        record = _leader(_url(tmp_path))
        assert record.epoch > epoch and record.address != leader.address
        if fault == signal.SIGSTOP:
            leader.signal(signal.SIGCONT)
            time.sleep(1.5)  # its next round finds the row changed
            # Woken up, it serves nothing itself: through it, calls go to the leader.
            via_old = TransactionManager.remote(leader.address)
            _commit(via_old, b"through the old leader", served)
            via_old.close()
            assert "stops leading tso" in leader.output()
    assert served == sorted(served) and len(set(served)) == len(served)
    with client.begin() as tx:
        assert (
            tx.get("t", b"r", b"c") == b"through the old leader"
            or tx.get("t", b"r", b"c") == b"killed"
        )
    client.close()


def test_split_roles_gateways_take_several_oracle_and_lock_addresses(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """``serve tso`` and ``serve locks --store`` replicas, and a gateway given all their
    addresses: killing the oracle leader and the lock leader costs a wait, not an error."""
    url = _url(tmp_path)
    oracles = [ServerProcess("tso", ["--store", url, *LEASE], tmp_path).start() for _ in range(2)]
    lockers = [ServerProcess("locks", ["--store", url, *LEASE], tmp_path).start() for _ in range(2)]
    servers.extend([*oracles, *lockers])
    gateway = ServerProcess(
        "txn",
        [
            "--store",
            url,
            "--tso",
            ",".join(o.address for o in oracles),
            "--locks",
            ",".join(locker.address for locker in lockers),
        ],
        tmp_path,
    ).start()
    servers.append(gateway)
    client = TransactionManager.remote(gateway.address, timeout_s=30)
    served: list[int] = []
    _commit(client, b"0", served)
    store = open_store(url)
    try:
        rows = store.get_system(LEADER_TABLE, [b"tso", b"locks"])
    finally:
        store.close()
    tso_leader = LeaseRecord.decode(rows[b"tso"]).address
    locks_leader = LeaseRecord.decode(rows[b"locks"]).address
    for server in [*oracles, *lockers]:
        if server.address in (tso_leader, locks_leader):
            server.kill()
    _commit(client, b"1", served)
    assert served == sorted(served)
    client.close()


def _status(*addresses: str) -> tuple[int, list[dict[str, Any]]]:
    done = subprocess.run(
        [sys.executable, "-m", "percolake", "status", "--gateway", ",".join(addresses), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def test_percolake_status_names_the_leader_its_epoch_and_the_replicas_it_cannot_reach(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    store = ["--store", _url(tmp_path), *LEASE]
    replicas = [ServerProcess("all", store, tmp_path).start() for _ in range(3)]
    servers.extend(replicas)
    addresses = [r.address for r in replicas]
    code, answers = _status(*addresses)
    assert code == 0, answers
    leases = [a["leases"][0] for a in answers]
    assert [lease["leading"] for lease in leases].count(True) == 1
    leader = _leader(_url(tmp_path))
    assert {lease["leader"] for lease in leases} == {leader.address}
    assert {lease["epoch"] for lease in leases} == {leader.epoch}

    dead = next(r for r in replicas if r.address == leader.address)
    dead.kill()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        code, answers = _status(*addresses)
        alive = [a for a in answers if not a["error"]]
        if any(a["leases"][0]["leading"] for a in alive):
            break
        time.sleep(0.2)
    assert code == 1  # one address does not answer
    (unreachable,) = [a for a in answers if a["error"]]
    assert unreachable["address"] == dead.address
    new = [a["leases"][0] for a in answers if not a["error"]]
    assert [lease["leading"] for lease in new].count(True) == 1
    assert all(lease["epoch"] == leader.epoch + 1 for lease in new)

    bad = subprocess.run(
        [sys.executable, "-m", "percolake", "status", "--gateway", "no-port"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "invalid address 'no-port'" in bad.stderr


def test_the_only_serve_restarted_after_kill_9_takes_over_at_once_on_sqlite(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """Fails before the fix (issue 30, item 10): a ``percolake serve`` restarted after
    ``kill -9`` of the only one waited out the dead leader's lease, although the SQLite
    claim proves the holder dead. With a 60 s lease that is 66 s, longer than a call
    waits for a leader (15 s): the first commit failed as unavailable. Now the leader
    holds the store's oracle claim for its term and marks its row ``claimed``; the
    restarted process gets the claim, takes over at once (epoch 2) and commits, above
    every timestamp served before the kill."""
    store = ["--store", _url(tmp_path), "--leader-lease-ms", "60000"]
    first = ServerProcess("all", store, tmp_path).start()
    servers.append(first)
    served: list[int] = []
    with TransactionManager.remote(first.address) as client:
        _commit(client, b"before", served)
    assert _leader(_url(tmp_path)).claimed
    first.kill()
    restarted = ServerProcess("all", store, tmp_path).start(port=first.port)
    servers.append(restarted)
    with TransactionManager.remote(restarted.address, timeout_s=30) as client:
        _commit(client, b"after", served)
        with client.begin() as tx:
            assert tx.get("t", b"r", b"c") == b"after"
    row = _leader(_url(tmp_path))
    assert row.epoch == 2 and row.claimed and not row.released
    assert served == sorted(served) and len(set(served)) == len(served)


def test_a_transaction_whose_gateway_died_is_aborted_not_unknown_to_the_client(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """A client of two replicas begins on the first, which is then killed: the
    transaction's next calls go to the second, which never held it. Failed before the
    fix with ``TransactionNotFoundError`` (neither "not committed" nor "unknown" to a
    caller), which also made the failover test above fail when the client's channel
    moved mid-transaction. Its writes were buffered in the dead gateway and its Commit
    never ran anywhere: it is definitely not committed, a ``TransactionAbortedError``."""
    store = ["--store", _url(tmp_path), *LEASE]
    first, second = (ServerProcess("all", store, tmp_path).start() for _ in range(2))
    servers.extend([first, second])
    client = TransactionManager.remote(f"{first.address},{second.address}", timeout_s=20)
    try:
        tx = client.begin()
        tx.put("t", b"lost", b"c", b"v")
        tx.flush()
        first.signal(signal.SIGKILL)
        tx.put("t", b"lost", b"d", b"w")
        with pytest.raises(TransactionAbortedError, match="is lost"):
            tx.flush()  # the Write fails over to the second replica
        assert tx.status.value == "aborted"
        with client.begin() as again:
            assert again.get("t", b"lost", b"c") is None
    finally:
        client.close()
