"""Deliberately broken builds, each switched on only by a test environment variable.

A chaos harness that never finds anything proves nothing. The broken-build test runs
the same chaos workload against gateways whose commits skip the locks and check for
write-write conflicts *before* writing their versions (``BROKEN_COMMIT_STEPS``), which
breaks rule S2: two overlapping writers can each check, find nothing, then both write
and commit. The harness must report anomalies for such a build.

The switch is the environment variable ``PERCOLAKE_UNSAFE_BROKEN_PROTOCOL=1`` and
nothing else; it is read only by :func:`install_broken_protocol_if_requested`, which a
process calls once at start-up (the chaos gateway and client entry points do; the
``percolake serve`` composition root may too). It changes the commit of every
transaction with writes in that process and logs that loudly.

The second switch, ``PERCOLAKE_UNSAFE_NO_ORACLE_CLAIM=1``, makes oracles skip their
claim on the store (:func:`disable_oracle_claims_if_requested`, honoured only by
``python -m percolake.chaos.serve``): a second oracle on one SQLite store then starts
and serves next to the first, as before the claim existed (rule S7), and the
oracle-overlap chaos run must report anomalies for that build.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

from percolake.chaos._config import BROKEN_PROTOCOL_ENV, NO_ORACLE_CLAIM_ENV
from storage_adapters import KVStore
from storage_adapters._base import Claim
from tso._oracle import ORACLE_ROLE, TimestampOracle
from txn._committer import STEPS
from txn._transaction import Transaction

log = logging.getLogger(__name__)

#: No ``lock`` step, and ``check`` before ``write``: violates rule S2 on purpose.
BROKEN_COMMIT_STEPS: Final[tuple[str, ...]] = (
    "check",
    "write",
    "commit_ts",
    "validate",
    "commit_point",
    "release",
)

#: Whether this process's ``Transaction.commit`` was replaced.
_state = {"installed": False}

#: ``setattr`` or a test's ``monkeypatch.setattr``.
Patch: TypeAlias = Callable[[object, str, object], None]


def broken_protocol_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``PERCOLAKE_UNSAFE_BROKEN_PROTOCOL`` is exactly ``"1"``."""
    env = os.environ if environ is None else environ
    return env.get(BROKEN_PROTOCOL_ENV) == "1"


def install_broken_protocol_if_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Make this process commit with :data:`BROKEN_COMMIT_STEPS` if the variable is set.

    Returns whether the broken protocol is in force. Idempotent.
    """
    if not broken_protocol_requested(environ):
        return _state["installed"]
    if not _state["installed"]:
        correct_commit = Transaction.commit

        def broken_commit(self: Transaction) -> int:
            if not self.buffered_writes:
                return correct_commit(self)  # read-only commits are trivial either way
            return self.committer(steps=BROKEN_COMMIT_STEPS).run()

        broken_commit.__doc__ = "UNSAFE test build: commit without locks, check before write."
        setattr(Transaction, "commit", broken_commit)  # noqa: B010 - a deliberate test switch
        _state["installed"] = True
        log.critical(
            "%s=1: this process commits with the BROKEN protocol %s instead of %s; "
            "it exists only to prove that chaos tests catch anomalies",
            BROKEN_PROTOCOL_ENV,
            ",".join(BROKEN_COMMIT_STEPS),
            ",".join(STEPS),
        )
    return True


def _claim_nothing(store: KVStore) -> Claim:
    return KVStore.claim(store, ORACLE_ROLE)  # the base claim: guards nothing


def disable_oracle_claims(patch: Patch = setattr) -> None:
    """UNSAFE: oracles in this process start without claiming their store (see S7)."""
    patch(TimestampOracle, "_claim_store", staticmethod(_claim_nothing))


def disable_oracle_claims_if_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Disable the oracle's claim if ``PERCOLAKE_UNSAFE_NO_ORACLE_CLAIM`` is exactly ``"1"``."""
    env = os.environ if environ is None else environ
    if env.get(NO_ORACLE_CLAIM_ENV) != "1":
        return False
    disable_oracle_claims()
    log.critical(
        "%s=1: timestamp oracles in this process start WITHOUT claiming their store, so a "
        "second oracle may serve next to a running one; it exists only to prove that "
        "chaos tests catch that",
        NO_ORACLE_CLAIM_ENV,
    )
    return True
