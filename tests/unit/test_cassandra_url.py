"""``cassandra://`` URL parsing and the row-to-shard map, with no server and no driver.

:mod:`storage_adapters._cassandra_url` must import without ``cassandra-driver``: one
test proves it in a subprocess where the driver cannot be imported.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage_adapters import open_store
from storage_adapters._cassandra_url import DEFAULT_SHARDS, parse_cassandra_url, shard_of

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_url_parsing_needs_no_driver() -> None:
    script = textwrap.dedent(
        """
        import sys

        sys.modules["cassandra"] = None  # any "import cassandra..." now raises ImportError
        from storage_adapters._cassandra_url import parse_cassandra_url, shard_of

        s = parse_cassandra_url("cassandra://u:pw@db1:9142,db2:9142/ks?shards=8")
        print(s.hosts, s.port, s.keyspace, s.shards, shard_of(b"row", s.shards))
        try:
            import storage_adapters.cassandra
        except ImportError:
            print("store needs the driver")
        from storage_adapters import open_store

        try:
            open_store("cassandra://db1/bad-name")
        except ValueError as exc:
            print("refused:", "keyspace" in str(exc))
        loaded = sorted(m for m in sys.modules if m == "cassandra" or m.startswith("cassandra."))
        print(loaded)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"('db1', 'db2') 9142 ks 8 {shard_of(b'row', 8)}",
        "store needs the driver",
        "refused: True",  # open_store names a malformed URL without the driver too
        "['cassandra']",  # only the blocking None entry: nothing of the driver was loaded
    ]


def test_url_defaults() -> None:
    s = parse_cassandra_url("cassandra://db1/ks")
    assert (s.hosts, s.port, s.keyspace) == (("db1",), 9042, "ks")
    assert (s.replication_factor, s.consistency, s.serial_consistency) == (1, "QUORUM", "SERIAL")
    assert (s.shards, s.shards_given) == (DEFAULT_SHARDS, False)


def test_url_with_every_option() -> None:
    s = parse_cassandra_url(
        "cassandra://u:p%40ss@10.0.0.1:9142,10.0.0.2:9142,[::1]:9142/Prod_1"
        "?replication_factor=3&consistency=local_quorum&serial_consistency=LOCAL_SERIAL"
        "&shards=64&local_dc=dc2&timeout_s=5&connect_timeout_s=2.5"
    )
    assert s.hosts == ("10.0.0.1", "10.0.0.2", "::1")
    assert (s.port, s.keyspace, s.replication_factor) == (9142, "Prod_1", 3)
    assert (s.consistency, s.serial_consistency) == ("LOCAL_QUORUM", "LOCAL_SERIAL")
    assert (s.shards, s.shards_given, s.local_dc) == (64, True, "dc2")
    assert (s.timeout_s, s.connect_timeout_s) == (5.0, 2.5)
    assert (s.username, s.password) == ("u", "p@ss")
    assert "p@ss" not in repr(s)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("cassandra://", "no keyspace"),
        ("cassandra://host", "no keyspace"),
        ("cassandra://host/", "no keyspace"),
        ("cassandra:///ks", "no host"),
        ("cassandra://host/bad-name", "keyspace"),
        ("cassandra://host/a/b", "keyspace"),
        ("cassandra://host/" + "k" * 49, "keyspace"),
        ("cassandra://host:0/ks", "bad port"),
        ("cassandra://host:99999/ks", "bad port"),
        ("cassandra://host:abc/ks", "bad port"),
        ("cassandra://a:9042,b:9043/ks", "same port"),
        ("cassandra://a,,b/ks", "bad host"),
        ("cassandra://[::1/ks", "IPv6"),
        ("cassandra://host/ks?replication=3", "unknown option"),
        ("cassandra://host/ks?replication_factor=0", "replication_factor"),
        ("cassandra://host/ks?replication_factor=x", "replication_factor"),
        ("cassandra://host/ks?consistency=ONE", "consistency"),
        ("cassandra://host/ks?serial_consistency=QUORUM", "serial_consistency"),
        ("cassandra://host/ks?shards=0", "shards"),
        ("cassandra://host/ks?shards=5000", "shards"),
        ("cassandra://host/ks?shards=2&shards=3", "twice"),
        ("cassandra://host/ks?timeout_s=-1", "timeout_s"),
        ("cassandra://host/ks?local_dc=", "local_dc"),
        ("cassandra://host/ks#frag", "fragment"),
        ("cassandra://user@host/ks", "credentials"),
    ],
)
def test_malformed_urls_are_refused_before_connecting(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        open_store(url)


def test_shard_of_is_stable_and_spreads_rows() -> None:
    assert shard_of(b"row-1", 32) == shard_of(b"row-1", 32)
    assert shard_of(b"anything", 1) == 0
    counts = [0] * 32
    for i in range(32_000):
        counts[shard_of(f"row{i:08d}".encode(), 32)] += 1
    assert max(counts) < 1.15 * 1000 and min(counts) > 0.85 * 1000
