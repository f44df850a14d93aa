"""The public surface of the core packages, pinned: what other packages may import.

Anything another package (percolake, spark_integration, bench, tests of other
packages) uses from txn, tso, lockserver or storage_adapters is exported here; their
``_private`` modules are theirs alone. A change to these sets is a change of the public
surface and should be one on purpose.
"""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.unit

EXPORTS = {
    "txn": {
        "COMMIT_STEPS",
        "CONFLICTS",
        "CommitAttempt",
        "ConflictRate",
        "DEFAULT_GRACE_MS",
        "EmbeddedTransaction",
        "GarbageCollector",
        "GcLoop",
        "GcReport",
        "GcStoppedError",
        "Isolation",
        "LockService",
        "Manager",
        "ReadTransaction",
        "Registration",
        "RetriesExhaustedError",
        "RetryPolicy",
        "TimestampSource",
        "Transaction",
        "TransactionConfig",
        "TransactionManager",
        "TransactionStatus",
        "run_transaction",
    },
    "txn.tables": {
        "ABORTED",
        "GC_TABLE",
        "GcState",
        "OWN_ABORTED_VALUE",
        "STATE_KEY",
        "TXN_TABLE",
        "decode_outcome",
        "encode_outcome",
        "read_state",
        "txn_key",
    },
    "tso": {
        "BOUND_KEY",
        "DEFAULT_LEADER_WAIT_S",
        "DEFAULT_LEASE_MS",
        "DEFAULT_WINDOW",
        "DRIFT_MARGIN",
        "LEADER_TABLE",
        "LeaderLease",
        "LeaseRecord",
        "LeaseView",
        "ORACLE_ROLE",
        "OracleAlreadyRunningError",
        "OracleFencedError",
        "RateLimitedWarning",
        "TSO_TABLE",
        "TimestampBatcher",
        "TimestampOracle",
        "TimestampRange",
        "WARNING_INTERVAL_S",
        "check_lease_ms",
    },
    "lockserver": {
        "LockTable",
        "LockTableClosedError",
        "LockToken",
        "LockWait",
        "MAX_DESCRIPTOR_BYTES",
        "MAX_LEASE_MS",
        "StaleTokenError",
        "render_descriptor",
    },
    "storage_adapters": {
        "AVAILABLE_STORES",
        "CasResult",
        "Cell",
        "Claim",
        "KVStore",
        "MAX_CELL_KEY_BYTES",
        "MAX_PAGE_SIZE",
        "MAX_ROW_BYTES",
        "MAX_SYSTEM_KEY_BYTES",
        "MAX_SYSTEM_VALUE_BYTES",
        "MAX_TIMESTAMP",
        "MAX_VALUE_BYTES",
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
    },
}


@pytest.mark.parametrize("module_name", sorted(EXPORTS))
def test_the_public_names_are_pinned_and_importable(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) == EXPORTS[module_name]
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def test_the_commit_steps_name_the_protocol_in_order() -> None:
    """The stable way to name steps (a test build passes other orders of these names)."""
    from txn import COMMIT_STEPS
    from txn._committer import PROTOCOL

    assert tuple(step.name for step in PROTOCOL) == COMMIT_STEPS
    assert COMMIT_STEPS == (
        "lock",
        "write",
        "check",
        "commit_ts",
        "validate",
        "commit_point",
        "release",
    )


def test_an_unknown_step_name_is_refused_when_the_manager_is_built() -> None:
    from lockserver import LockTable
    from storage_adapters import open_store
    from tso import TimestampBatcher, TimestampOracle
    from txn import TransactionManager

    store = open_store("memory://")
    timestamps = TimestampBatcher(TimestampOracle(store).next_range)
    with pytest.raises(ValueError, match="unknown commit steps"):
        TransactionManager(store, timestamps, LockTable(), commit_steps=("lock", "wirte"))
