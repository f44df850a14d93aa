"""The bottom layer: what crosses a process boundary, shared by every building block.

``errors`` is the one error root (it imports nothing); ``metrics`` the Prometheus
registry every layer records into; ``rpc`` channels, TLS, gRPC status mapping and replica
failover; ``v1`` the generated code of the ``percolake.v1`` protobuf package
(``scripts/gen_protos.py``). Like ``service`` and ``exceptions`` in temporalio's SDK, it
never imports a layer above it: the layer contract in ``pyproject.toml`` checks that.
Importing this package imports none of its modules.
"""
