"""Pluggable multi-version key-value stores behind one small interface.

``open_store(url)`` picks the backend from the URL scheme:

=====================================================  ==========================
``memory://``                                           in-process, not durable
``sqlite:///relative/path.db``, ``sqlite:////abs.db``   one SQLite file, durable
``cassandra://HOST[:PORT][,HOST...]/KEYSPACE[?...]``    Apache Cassandra
=====================================================  ==========================
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from storage_adapters._base import (
    MAX_CELL_KEY_BYTES,
    MAX_PAGE_SIZE,
    MAX_ROW_BYTES,
    MAX_SYSTEM_KEY_BYTES,
    MAX_SYSTEM_VALUE_BYTES,
    MAX_TIMESTAMP,
    MAX_VALUE_BYTES,
    CasResult,
    Cell,
    Claim,
    KVStore,
    ScanEntry,
    StoreClaimedError,
    Version,
    VersionStamp,
    VersionWrite,
    check_cell,
    check_cells,
    check_scan_bounds,
    check_table,
    check_value,
)
from wire.errors import StoreError, StoreTimeoutError, StoreUnavailableError

__all__ = [
    "AVAILABLE_STORES",
    "MAX_CELL_KEY_BYTES",
    "MAX_PAGE_SIZE",
    "MAX_ROW_BYTES",
    "MAX_SYSTEM_KEY_BYTES",
    "MAX_SYSTEM_VALUE_BYTES",
    "MAX_TIMESTAMP",
    "MAX_VALUE_BYTES",
    "CasResult",
    "Cell",
    "Claim",
    "KVStore",
    "ScanEntry",
    "StoreClaimedError",
    "StoreError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "Version",
    "VersionStamp",
    "VersionWrite",
    "check_cell",
    "check_cells",
    "check_scan_bounds",
    "check_table",
    "check_value",
    "open_store",
]

#: scheme -> (module, class, pip extra that provides its dependencies)
AVAILABLE_STORES: dict[str, tuple[str, str, str | None]] = {
    "memory": ("storage_adapters.memory", "MemoryStore", None),
    "sqlite": ("storage_adapters.sqlite", "SQLiteStore", None),
    "cassandra": ("storage_adapters.cassandra", "CassandraStore", "cassandra"),
}


def open_store(url: str) -> KVStore:
    """Open the store a URL names. Raises ``ValueError`` naming what is wrong with it."""
    if not isinstance(url, str):
        raise TypeError(f"store URL must be str, got {type(url).__name__}")
    scheme = urlsplit(url).scheme if "://" in url else ""
    if not scheme:
        raise ValueError(
            f"invalid store URL {url!r}: expected scheme://..., one of "
            f"{', '.join(s + '://' for s in AVAILABLE_STORES)}"
        )
    if scheme not in AVAILABLE_STORES:
        raise ValueError(
            f"unknown store scheme {scheme!r} in {url!r}: expected one of "
            f"{', '.join(sorted(AVAILABLE_STORES))}"
        )
    module_name, class_name, extra = AVAILABLE_STORES[scheme]
    if scheme == "memory" and url not in ("memory://", "memory:///"):
        raise ValueError(f"invalid memory URL {url!r}: expected exactly 'memory://'")
    if scheme == "cassandra":
        # A malformed URL is a ValueError naming the problem even where the driver
        # is not installed: the URL module needs nothing but the standard library.
        from storage_adapters._cassandra_url import parse_cassandra_url

        parse_cassandra_url(url)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # a backend whose driver is not installed
        hint = f": pip install 'percolake[{extra}]'" if extra else ""
        raise ImportError(f"store {scheme!r} needs extra dependencies{hint} ({exc})") from exc
    store_class: type[KVStore] = getattr(module, class_name)
    return store_class(url)  # type: ignore[call-arg]
