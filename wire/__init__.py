"""The bottom layer: what crosses a process boundary, shared by every building block.

``errors`` is the one error root (it imports nothing); ``metrics`` the Prometheus
registry every layer records into; ``error_codes`` the one mapping between exceptions
and gRPC status codes (``status_for``, ``error_from``); ``auth`` TLS and the bearer
token; ``failover`` the client's channel over several replicas; ``channels`` addresses,
channels and calls, on top of those three; ``v1`` the generated code of the
``percolake.v1`` protobuf package (``scripts/gen_protos.py``). Like ``service`` and
``exceptions`` in temporalio's SDK, it never imports a layer above it: the layer
contract in ``pyproject.toml`` checks that. Importing this package imports none of its
modules.
"""
