"""Start-up checks of ``percolake serve``: what can fail for a flag's sake fails here,
in one line that begins with the flag, before the store is opened and the leader lease
touched (a replica that cannot serve must not take, and bump, the lease)."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from wire.auth import TlsConfig
from wire.channels import parse_address
from wire.errors import PercolakeError


class StartupError(PercolakeError, ValueError):
    """``percolake serve`` cannot start as configured; the message begins with the flag
    to fix. Raised before the leader lease is touched."""


def check_listen(listen: str) -> None:
    """``--listen`` names a port this process can bind now: the cause in one line
    (gRPC reports any failure as "Failed to bind"). Port 0 always can."""
    host, port = parse_address(listen)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"--listen {listen}: cannot resolve {host!r}: {exc}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As gRPC binds: a port in TIME_WAIT is fine, one something listens on is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise StartupError(f"--listen {listen}: {exc.strerror or exc}") from None


def check_tls_files(cert: str | None, key: str | None, client_ca: str | None) -> TlsConfig:
    """The server's TLS material, read and checked now (the key matches the
    certificate, the CA parses); :class:`StartupError` naming the flag otherwise."""
    if not (cert and key):
        missing = "--tls-key" if cert else "--tls-cert"
        raise StartupError(f"{missing}: TLS needs both --tls-cert and --tls-key")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", client_ca)):
        if path is None:
            continue
        try:
            Path(path).read_bytes()
        except OSError as exc:
            raise StartupError(f"{flag} {path}: cannot read it: {exc.strerror}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # An encrypted key would make OpenSSL prompt on the terminal; gRPC cannot use
        # one either, so the empty password fails it here with a reason.
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise StartupError(
                f"--tls-key {key}: does not match the certificate --tls-cert {cert}"
            ) from None
        raise StartupError(
            f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its "
            f"unencrypted key ({exc.reason or exc})"
        ) from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except ssl.SSLError as exc:
            raise StartupError(
                f"--tls-client-ca {client_ca}: not a PEM CA certificate ({exc.reason or exc})"
            ) from None
    tls = TlsConfig(cert, key, client_ca)
    tls.server_credentials()  # what gRPC will read
    return tls
