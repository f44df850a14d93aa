"""``cassandra://`` URLs and the row-to-shard map: the parts of the backend that need no driver.

Kept apart from :mod:`storage_adapters.cassandra`, which imports ``cassandra-driver``:
parsing a URL and computing a row's shard need nothing but the standard library, so
``open_store`` can validate a ``cassandra://`` URL before it needs the driver, and a
machine without the driver still gets a clear error (the URL's own problem, or the
missing extra) rather than an ``ImportError`` from deep inside the backend. The URL
options are described in :mod:`storage_adapters.cassandra`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_SHARDS",
    "CassandraSettings",
    "parse_cassandra_url",
    "redact_url",
    "shard_of",
]

DEFAULT_PORT = 9042
DEFAULT_SHARDS = 32

_KEYSPACE = re.compile(r"[A-Za-z0-9_]{1,48}")
_HOST = re.compile(r"[A-Za-z0-9.-]+")
_DATA_LEVELS = ("QUORUM", "LOCAL_QUORUM", "ALL")
_SERIAL_LEVELS = ("SERIAL", "LOCAL_SERIAL")
_OPTIONS = (
    "replication_factor",
    "consistency",
    "serial_consistency",
    "shards",
    "local_dc",
    "timeout_s",
    "connect_timeout_s",
)


@dataclass(frozen=True, slots=True)
class CassandraSettings:
    """What a ``cassandra://`` URL asks for."""

    hosts: tuple[str, ...]
    port: int
    keyspace: str
    replication_factor: int = 1
    consistency: str = "QUORUM"
    serial_consistency: str = "SERIAL"
    shards: int = DEFAULT_SHARDS
    shards_given: bool = False
    local_dc: str | None = None
    timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def parse_cassandra_url(url: str) -> CassandraSettings:
    """Parse and validate a ``cassandra://`` URL; ``ValueError`` names what is wrong."""
    if not isinstance(url, str):
        raise TypeError(f"store URL must be str, got {type(url).__name__}")
    prefix = "cassandra://"
    if not url.startswith(prefix):
        raise ValueError(f"not a cassandra URL: {url!r}")
    rest = url[len(prefix) :]
    rest, _, query = rest.partition("?")
    if "#" in query or "#" in rest:
        raise ValueError(f"invalid cassandra URL {url!r}: fragments ('#') are not allowed")
    netloc, slash, path = rest.partition("/")
    if not slash or not path:
        raise ValueError(
            f"invalid cassandra URL {url!r}: no keyspace (expected cassandra://HOST[:PORT]/KEYSPACE)"
        )
    if not _KEYSPACE.fullmatch(path):
        raise ValueError(
            f"invalid cassandra URL {url!r}: keyspace {path!r} must be 1-48 characters "
            "from [A-Za-z0-9_]"
        )
    username = password = None
    if "@" in netloc:
        credentials, _, netloc = netloc.rpartition("@")
        user, colon, secret = credentials.partition(":")
        if not user or not colon:
            raise ValueError("invalid cassandra URL: credentials must be user:password@")
        username, password = unquote(user), unquote(secret)
    hosts, port = _parse_hosts(url, netloc)
    options = _parse_options(url, query)
    return CassandraSettings(
        hosts=hosts,
        port=port,
        keyspace=path,
        username=username,
        password=password,
        **options,
    )


def _parse_hosts(url: str, netloc: str) -> tuple[tuple[str, ...], int]:
    if not netloc:
        raise ValueError(f"invalid cassandra URL {url!r}: no host")
    hosts: list[str] = []
    ports: set[int] = set()
    for part in netloc.split(","):
        if part.startswith("["):  # [IPv6]:port
            host, bracket, tail = part[1:].partition("]")
            if not bracket or not host or (tail and not tail.startswith(":")):
                raise ValueError(f"invalid cassandra URL {url!r}: bad IPv6 host {part!r}")
            port_text = tail[1:] if tail else ""
        else:
            host, _, port_text = part.partition(":")
            if not host or not _HOST.fullmatch(host):
                raise ValueError(f"invalid cassandra URL {url!r}: bad host {part!r}")
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"invalid cassandra URL {url!r}: bad port {port_text!r}")
            ports.add(int(port_text))
        else:
            ports.add(DEFAULT_PORT)
        hosts.append(host)
    if len(ports) > 1:
        raise ValueError(
            f"invalid cassandra URL {url!r}: every host must use the same port, got {sorted(ports)}"
        )
    return tuple(hosts), ports.pop()


def _parse_options(url: str, query: str) -> dict[str, Any]:
    try:
        raw = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ValueError(f"invalid cassandra URL {url!r}: bad query string ({exc})") from None
    unknown = sorted(set(raw) - set(_OPTIONS))
    if unknown:
        raise ValueError(
            f"invalid cassandra URL {url!r}: unknown option(s) {unknown}; "
            f"expected some of {list(_OPTIONS)}"
        )
    options: dict[str, Any] = {}
    for name, values in raw.items():
        if len(values) != 1:
            raise ValueError(f"invalid cassandra URL {url!r}: option {name!r} given twice")
        value = values[0]
        if name in ("replication_factor", "shards"):
            limit = 4096 if name == "shards" else 100
            if not value.isdigit() or not 1 <= int(value) <= limit:
                raise ValueError(
                    f"invalid cassandra URL {url!r}: {name} must be an integer in [1, {limit}], "
                    f"got {value!r}"
                )
            options[name] = int(value)
        elif name == "consistency":
            options[name] = _level(url, name, value, _DATA_LEVELS)
        elif name == "serial_consistency":
            options[name] = _level(url, name, value, _SERIAL_LEVELS)
        elif name in ("timeout_s", "connect_timeout_s"):
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if not 0 < seconds <= 3600:
                raise ValueError(
                    f"invalid cassandra URL {url!r}: {name} must be seconds in (0, 3600], "
                    f"got {value!r}"
                )
            options[name] = seconds
        elif name == "local_dc":
            if not value:
                raise ValueError(f"invalid cassandra URL {url!r}: local_dc is empty")
            options[name] = value
    options["shards_given"] = "shards" in options
    return options


def _level(url: str, name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value.upper() not in allowed:
        raise ValueError(
            f"invalid cassandra URL {url!r}: {name} must be one of {list(allowed)}, got {value!r}"
        )
    return value.upper()


def shard_of(row: bytes, shards: int) -> int:
    """The partition (of ``shards``) that holds ``row``: stable across processes."""
    digest = hashlib.blake2b(row, digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def redact_url(url: str) -> str:
    """The URL without its password, for logs."""
    head, at, tail = url.partition("@")
    if not at:
        return url
    scheme, _, credentials = head.partition("://")
    user = credentials.partition(":")[0]
    return f"{scheme}://{user}:***@{tail}"
