"""The CPU breakdown finds the server processes by their listening sockets."""

from __future__ import annotations

import os
import socket

import pytest

from bench.bench_cassandra_cpu import listening_pids

pytestmark = pytest.mark.unit


def test_a_listening_socket_names_its_process_and_a_connected_one_does_not() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert os.getpid() in listening_pids({("127.0.0.1", port)})
        with socket.create_connection(("127.0.0.1", port)) as client:
            client_port = client.getsockname()[1]
            # A connected (not listening) socket's address names nobody.
            assert listening_pids({("127.0.0.1", client_port)}) == []
        assert listening_pids({("127.0.0.2", port)}) == []
