"""Server reflection of ``percolake serve``, in both protocols clients ask for."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from grpc_reflection.v1alpha import reflection, reflection_pb2

#: Server reflection as grpcurl and newer clients ask for it first. grpcio-reflection
#: serves only ``grpc.reflection.v1alpha``; the ``v1`` protocol is the same proto under
#: another package (every message and field number alike), so the same servicer answers
#: both, and v1's file is v1alpha's with its name and package changed.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_REFLECTION_V1_FILE = "grpc/reflection/v1/reflection.proto"


def enable_reflection(server: grpc.Server, names: list[str]) -> None:
    """Answer reflection (v1alpha and v1) for the services ``names`` on ``server``."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_REFLECTION_V1_FILE)  # registered already (a newer library)
    except KeyError:
        alpha = descriptor_pb2.FileDescriptorProto()
        reflection_pb2.DESCRIPTOR.CopyToProto(alpha)
        # The package, every type reference to it and the language options.
        text = text_format.MessageToString(alpha).replace("v1alpha", "v1")
        v1 = text_format.Parse(text, descriptor_pb2.FileDescriptorProto())
        v1.name = _REFLECTION_V1_FILE
        v1.options.ClearField("deprecated")
        pool.Add(v1)
    servicer = reflection.ReflectionServicer([*names, reflection.SERVICE_NAME, REFLECTION_V1])
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for service in (reflection.SERVICE_NAME, REFLECTION_V1):
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"ServerReflectionInfo": handler}),)
        )
