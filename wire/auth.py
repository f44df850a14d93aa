"""Who may call: TLS material for servers and clients, and the bearer token (read from
a flag, a file or ``$PERCOLAKE_TOKEN``, sent by clients, checked by servers)."""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from wire.error_codes import REASON_KEY, UNAUTHENTICATED

TOKEN_ENV = "PERCOLAKE_TOKEN"


#: Methods any caller may use without the token: load balancers and orchestrators
#: probe health without credentials, and tools such as ``grpcurl`` first ask server
#: reflection for the health service's schema (with reflection refused, ``grpcurl ...
#: grpc.health.v1.Health/Check`` failed as unauthenticated). Health reveals whether a
#: service is serving; reflection the schemas, which ``proto/`` publishes anyway.
UNAUTHENTICATED_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Server: certificate and key, optionally a CA that client certificates must chain to.
    Client: the CA to trust, optionally a client certificate and key (mutual TLS)."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        if not (self.cert_file and self.key_file):
            raise ValueError("TLS on a server needs both a certificate and a key file")
        pair = (_read(self.key_file), _read(self.cert_file))
        ca = _read(self.ca_file) if self.ca_file else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs its key file, and the other way round")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file) if self.ca_file else None,
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None,
        )


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc


def resolve_token(token: str | None = None, token_file: str | None = None) -> str | None:
    """The bearer token: given, else from a file, else ``$PERCOLAKE_TOKEN``, else none."""
    if token is not None and token_file is not None:
        raise ValueError("give a token or a token file, not both")
    if token_file is not None:
        token = _read(token_file).decode().strip()
        if not token:
            raise ValueError(f"token file {token_file} is empty")
    elif token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is not None and (not token.isprintable() or " " in token):
        raise ValueError("a token must be printable and contain no spaces")
    return token


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata every call carries: the bearer token (``$PERCOLAKE_TOKEN`` if none)."""
    token = resolve_token(token)
    return (("authorization", f"Bearer {token}"),) if token else ()


if TYPE_CHECKING:
    _Interceptor = grpc.ServerInterceptor
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor
    _Handler = grpc.RpcMethodHandler


class TokenInterceptor(_Interceptor):
    """Refuses every call without ``authorization: Bearer <token>`` before it runs."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        method = str(details.method)
        if method.startswith(UNAUTHENTICATED_PREFIXES):
            return continuation(details)
        presented = b""
        for metadatum in details.invocation_metadata or ():
            if metadatum[0] == "authorization":
                value = metadatum[1]
                presented = value.encode() if isinstance(value, str) else bytes(value)
        if hmac.compare_digest(presented, self._expected):
            return continuation(details)
        return _deny(continuation(details))


def _deny(handler: _Handler | None) -> _Handler:
    def refuse(request: object, context: grpc.ServicerContext) -> NoReturn:
        context.set_trailing_metadata(((REASON_KEY, UNAUTHENTICATED),))
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        raise AssertionError("unreachable")  # pragma: no cover

    if handler is not None and handler.response_streaming:
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.unary_stream_rpc_method_handler(refuse)
    if handler is not None and handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
