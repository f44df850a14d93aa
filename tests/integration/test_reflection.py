"""Server reflection of a real ``percolake serve``, in both protocol versions (issue 31):
``grpc.reflection.v1`` is what grpcurl and newer clients ask for first."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as pb

from tests.servers import ServerProcess

pytestmark = pytest.mark.integration


def _ask(
    channel: grpc.Channel, version: str, *requests: pb.ServerReflectionRequest
) -> list[pb.ServerReflectionResponse]:
    # v1 and v1alpha messages are the same on the wire: v1alpha's types ask both.
    info = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=pb.ServerReflectionRequest.SerializeToString,
        response_deserializer=pb.ServerReflectionResponse.FromString,
    )
    return list(info(iter(requests), timeout=10))


def test_reflection_answers_v1_and_v1alpha(tmp_path: Path) -> None:
    """Fails before issue 31: v1 was UNIMPLEMENTED, only v1alpha was served."""
    server = ServerProcess("all", ["--store", "memory://"], tmp_path).start()
    channel = grpc.insecure_channel(server.address)
    try:
        for version in ("v1", "v1alpha"):
            listed, described, itself = _ask(
                channel,
                version,
                pb.ServerReflectionRequest(list_services=""),
                pb.ServerReflectionRequest(
                    file_containing_symbol="percolake.v1.TransactionService"
                ),
                pb.ServerReflectionRequest(
                    file_containing_symbol="grpc.reflection.v1.ServerReflection"
                ),
            )
            names = {s.name for s in listed.list_services_response.service}
            assert {
                "percolake.v1.TransactionService",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            } <= names, (version, names)
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in described.file_descriptor_response.file_descriptor_proto
            ]
            assert any(
                f.package == "percolake.v1" and "TransactionService" in {s.name for s in f.service}
                for f in files
            ), version
            (v1,) = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in itself.file_descriptor_response.file_descriptor_proto
            ]
            assert v1.package == "grpc.reflection.v1" and not v1.dependency
            (method,) = v1.service[0].method
            assert method.name == "ServerReflectionInfo"
            # Its types are its own (a client resolves them in this file alone).
            assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
            assert "v1alpha" not in str(v1)
    finally:
        channel.close()
        server.stop()
