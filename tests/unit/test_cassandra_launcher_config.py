"""The Cassandra launcher's configuration and command line, with no server started.

Node layout (addresses, ports, tokens, directories), the Java command line, the
rendered ``cassandra.yaml`` and the ``percolake cassandra`` parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from percolake.tools.cassandra import ClusterLayout, add_cassandra_commands, main
from percolake.tools.cassandra.launcher import java_command, node_config, render_yaml

pytestmark = pytest.mark.unit


def test_three_node_layout_has_distinct_addresses_ports_and_even_tokens(tmp_path: Path) -> None:
    layout = ClusterLayout(nodes=3, base_dir=tmp_path, jmx_port=7199)
    configs = [node_config(layout, i) for i in (1, 2, 3)]
    assert [c["listen_address"] for c in configs] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    tokens = [int(c["initial_token"]) for c in configs]
    assert tokens == [-(2**63), -(2**63) + 2**64 // 3, -(2**63) + 2 * (2**64 // 3)]
    assert all(c["paxos_variant"] == "v2" and c["auto_snapshot"] is False for c in configs)
    assert all(c["auto_bootstrap"] is False for c in configs)
    seeds = {c["seed_provider"][0]["parameters"][0]["seeds"] for c in configs}
    assert seeds == {"127.0.0.1:7000"}
    assert len({c["data_file_directories"][0] for c in configs}) == 3
    jamm = tmp_path / "lib" / "jamm-0.4.0.jar"
    jamm.parent.mkdir()
    jamm.touch()
    jmx = [
        next(a for a in java_command(layout, i, "java", jamm.parent) if "jmx.local.port" in a)
        for i in (1, 2, 3)
    ]
    assert jmx == [f"-Dcassandra.jmx.local.port={p}" for p in (7199, 7200, 7201)]
    command = java_command(layout, 1, "java", jamm.parent)
    assert f"-javaagent:{jamm}" in command
    assert "-Djdk.attach.allowAttachSelf=true" in command
    assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in command
    assert command[-1] == "org.apache.cassandra.service.CassandraDaemon"


def test_rendered_yaml_is_one_json_value_per_key(tmp_path: Path) -> None:
    import json

    layout = ClusterLayout(nodes=1, base_dir=tmp_path, extra_yaml={"concurrent_reads": 8})
    text = render_yaml(node_config(layout, 1))
    pairs = dict(line.split(": ", 1) for line in text.splitlines()[1:])
    assert json.loads(pairs["concurrent_reads"]) == 8
    assert json.loads(pairs["initial_token"]) == str(-(2**63))


def test_cli_parser_has_start_stop_status() -> None:
    parser = argparse.ArgumentParser(prog="percolake")
    add_cassandra_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cassandra", "start", "--nodes", "3", "--dir", "/tmp/x"])
    assert (args.cassandra_command, args.nodes, args.dir) == ("start", 3, "/tmp/x")
    assert callable(args.handler)


def test_stop_without_a_cluster_fails_cleanly(tmp_path: Path) -> None:
    assert main(["stop", "--dir", str(tmp_path / "none")]) == 1
