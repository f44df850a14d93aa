"""Channels to percolake's services: addresses, channel options (message size, the
retry policy of calls that are safe to repeat), one channel or a failover channel over
replicas, and the calls made on them, each failure turned into the exception it stands
for (:mod:`wire.error_codes`)."""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar, overload

import grpc

from wire.auth import TlsConfig, auth_metadata
from wire.error_codes import error_from
from wire.failover import SAFE_TO_RETRY, ReplicaChannel

#: Metadata on a call one replica forwards to the leader: never forwarded again.
FORWARDED_KEY = "percolake-forwarded"

#: Default cap on one message either way; larger requests get RESOURCE_EXHAUSTED.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) with a port in 0..65535; ``ValueError`` otherwise."""
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT")
    host, _, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT with a port number")
    return host, int(port_text)


def parse_addresses(addresses: str) -> list[str]:
    """``HOST:PORT[,HOST:PORT...]``: one service, or replicas of one; ``ValueError`` naming
    the bad part otherwise."""
    if not isinstance(addresses, str) or not addresses.strip():
        raise ValueError("expected HOST:PORT or several, separated by commas")
    parts = [part.strip() for part in addresses.split(",")]
    if any(not part for part in parts):
        raise ValueError(f"invalid address list {addresses!r}: an empty entry")
    for part in parts:
        parse_address(part)
    if len(set(parts)) != len(parts):
        raise ValueError(f"invalid address list {addresses!r}: an address repeats")
    return parts


def _replica_target(addresses: list[str]) -> str:
    """One gRPC target for several replicas: ``ipv4:`` or ``ipv6:`` with every address
    (names resolved now), for the ``pick_first`` policy to fail over between."""
    resolved: list[tuple[int, str, int]] = []
    for address in addresses:
        host, port = parse_address(address)
        try:
            ip = ipaddress.ip_address(host)
            resolved.append((ip.version, str(ip), port))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ValueError(f"cannot resolve {host!r} in {address!r}: {exc}") from exc
        family, *_, sockaddr = min(infos, key=lambda info: info[0] != socket.AF_INET)
        resolved.append((4 if family == socket.AF_INET else 6, str(sockaddr[0]), port))
    versions = {version for version, _, _ in resolved}
    if len(versions) > 1:
        raise ValueError(f"replica addresses mix IPv4 and IPv6: {','.join(addresses)}")
    if versions == {6}:
        return "ipv6:" + ",".join(f"[{ip}]:{port}" for _, ip, port in resolved)
    return "ipv4:" + ",".join(f"{ip}:{port}" for _, ip, port in resolved)


#: Retry UNAVAILABLE for calls that are safe to repeat. Commit is never retried
#: (rule S6); its outcome is settled with Status instead.
_RETRY = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
_SERVICE_CONFIG = json.dumps({"methodConfig": [{"name": SAFE_TO_RETRY, "retryPolicy": _RETRY}]})


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _SERVICE_CONFIG),
        ("grpc.keepalive_time_ms", 30_000),
    ]


@overload
def open_channel(
    address: str,
    tls: TlsConfig | None = ...,
    max_message_bytes: int = ...,
    *,
    aio: Literal[False] = ...,
) -> grpc.Channel: ...
@overload
def open_channel(
    address: str,
    tls: TlsConfig | None = ...,
    max_message_bytes: int = ...,
    *,
    aio: Literal[True],
) -> grpc.aio.Channel: ...
def open_channel(
    address: str,
    tls: TlsConfig | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    aio: bool = False,
) -> grpc.Channel | grpc.aio.Channel:
    """A channel to ``address`` with percolake's options: blocking, or ``grpc.aio``.

    Several addresses (``h1:7070,h2:7070``) are replicas: the channel uses the first
    that answers and, when it fails or stops answering pings, the next.
    """
    addresses = parse_addresses(address)
    options = channel_options(max_message_bytes)
    if len(addresses) > 1:
        if not aio:
            return ReplicaChannel(
                addresses, lambda replica: open_channel(replica, tls, max_message_bytes)
            )
        # grpc.aio clients (the oracle's asyncio client) leave failover to pick_first.
        options += [("grpc.lb_policy_name", "pick_first")]
        address = _replica_target(addresses)
    credentials = None if tls is None else tls.channel_credentials()
    if aio:
        if credentials is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, credentials, options=options)
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


class Connection:
    """A channel plus the metadata every call carries (the bearer token)."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: TlsConfig | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.channel = open_channel(address, tls, max_message_bytes)
        self.address = address
        self.metadata = auth_metadata(token)

    def close(self) -> None:
        self.channel.close()


Response = TypeVar("Response")


def call(
    fn: Callable[..., Response], request: object, conn: Connection, timeout_s: float
) -> Response:
    """Make one unary call, turning a failure into the exception it stands for."""
    try:
        return fn(request, metadata=conn.metadata, timeout=timeout_s)
    except grpc.RpcError as err:
        raise error_from(err) from None


def stream(
    fn: Callable[..., Iterator[Response]], request: object, conn: Connection, timeout_s: float
) -> Iterator[Response]:
    """Make one server-streaming call; closing the iterator cancels the call."""
    responses = fn(request, metadata=conn.metadata, timeout=timeout_s)
    try:
        yield from responses
    except grpc.RpcError as err:
        raise error_from(err) from None
    finally:
        cancel = getattr(responses, "cancel", None)
        if cancel is not None:
            cancel()


def forwarded(context: grpc.ServicerContext) -> bool:
    """Whether another replica forwarded this call (see :data:`FORWARDED_KEY`)."""
    return any(key == FORWARDED_KEY for key, _ in context.invocation_metadata() or ())
