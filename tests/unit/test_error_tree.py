"""One error root: every exception percolake raises on purpose derives from it.

Issue 12: gateway failures (``UnauthenticatedError``, ``ServiceUnavailableError``)
lived outside the ``TransactionError`` tree, so ``except TransactionError`` missed
them; that gap is how a committed lakehouse version lost its files. Before the
fix the walk below found six roots.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from percolake.errors import (
    PercolakeError,
    ServiceUnavailableError,
    TransactionError,
    UnauthenticatedError,
)

pytestmark = pytest.mark.unit

#: Every module whose exceptions are public (re-exported or raised to callers).
PUBLIC_MODULES = [
    "percolake.errors",
    "percolake.rpc",
    "percolake.checker",
    "percolake.cassandra.launcher",
    "storage_adapters",
    "tso",
    "lockserver",
    "txn.errors",
    "spark_integration",
]


def _public_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and not attr.startswith("_")
                and value.__module__.split(".")[0]
                in {
                    "percolake",
                    "storage_adapters",
                    "tso",
                    "lockserver",
                    "txn",
                    "spark_integration",
                }
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_public_exception_derives_from_the_one_root() -> None:
    exceptions = _public_exceptions()
    assert len(exceptions) >= 20  # the walk did find the tree
    outside = sorted(
        name for name, kind in exceptions.items() if not issubclass(kind, PercolakeError)
    )
    assert outside == []


def test_every_transactional_failure_is_a_transaction_error() -> None:
    from percolake import rpc
    from spark_integration import ConcurrentModificationError
    from txn import errors

    for kind in (
        rpc.RpcError,
        rpc.ServiceUnavailableError,
        rpc.UnauthenticatedError,
        errors.CommitUnknownError,
        errors.TransactionConflictError,
        ConcurrentModificationError,
    ):
        assert issubclass(kind, TransactionError), kind


def test_gateway_errors_are_also_the_matching_builtins() -> None:
    from percolake import rpc

    assert issubclass(rpc.ServiceUnavailableError, ServiceUnavailableError)
    assert issubclass(rpc.ServiceUnavailableError, ConnectionError)
    assert issubclass(rpc.UnauthenticatedError, UnauthenticatedError)
    assert issubclass(rpc.UnauthenticatedError, PermissionError)


def test_the_leaves_keep_their_meaning() -> None:
    """ "Definitely not committed" and "unknown" stay apart."""
    from txn import errors

    assert not issubclass(errors.CommitUnknownError, errors.TransactionAbortedError)
    assert not issubclass(ServiceUnavailableError, errors.TransactionAbortedError)
    assert not issubclass(errors.TransactionAbortedError, errors.CommitUnknownError)
