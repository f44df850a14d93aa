"""Deliberately broken builds, each switched on only by a test environment variable.

A chaos harness that never finds anything proves nothing. The broken-build test runs
the same chaos workload against gateways whose commits skip the locks and check for
write-write conflicts *before* writing their versions (``BROKEN_COMMIT_STEPS``), which
breaks rule S2: two overlapping writers can each check, find nothing, then both write
and commit. The harness must report anomalies for such a build.

The switch is the environment variable ``PERCOLAKE_UNSAFE_BROKEN_PROTOCOL=1`` and
nothing else. The second switch, ``PERCOLAKE_UNSAFE_NO_ORACLE_CLAIM=1``, makes oracles
skip their claim on the store: a second oracle on one SQLite store then starts and
serves next to the first, as before the claim existed (rule S7), and the
oracle-overlap chaos run must report anomalies for that build. The third,
``PERCOLAKE_UNSAFE_LEADER_IGNORES_LEASE=1``, makes a leading replica serve timestamps
without checking that its leader lease is still valid (``LeaderLease(check_validity=
False)``): a leader paused past its lease wakes up and serves from its old window while
another replica leads, and the timestamps chaos run must report real-time order
violations for that build.

Nothing is patched: :func:`unsafe_build_from_env` turns the variables into explicit
constructor arguments (the manager's ``commit_steps``, the oracle's ``claim_store``,
the control plane's ``check_lease``), which only the chaos entry points (``python -m
percolake.tools.chaos.serve``, the chaos client) read and pass on. The installed
``percolake serve`` never looks at them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

from percolake.tools.chaos._config import (
    BROKEN_PROTOCOL_ENV,
    LEADER_IGNORES_LEASE_ENV,
    NO_ORACLE_CLAIM_ENV,
)
from txn import COMMIT_STEPS

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


@dataclass(frozen=True, slots=True)
class UnsafeBuild:
    """What a test build breaks on purpose; the default breaks nothing."""

    commit_steps: tuple[str, ...] = COMMIT_STEPS
    oracle_claims: bool = True
    leader_checks_lease: bool = True


def broken_protocol_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``PERCOLAKE_UNSAFE_BROKEN_PROTOCOL`` is exactly ``"1"``."""
    env = os.environ if environ is None else environ
    return env.get(BROKEN_PROTOCOL_ENV) == "1"


def unsafe_build_from_env(environ: Mapping[str, str] | None = None) -> UnsafeBuild:
    """The broken build the test environment asks for, logged loudly; else a safe one."""
    env = os.environ if environ is None else environ
    build = UnsafeBuild()
    if broken_protocol_requested(env):
        build = replace(build, commit_steps=BROKEN_COMMIT_STEPS)
        log.critical(
            "%s=1: this process commits with the BROKEN protocol %s instead of %s; "
            "it exists only to prove that chaos tests catch anomalies",
            BROKEN_PROTOCOL_ENV,
            ",".join(BROKEN_COMMIT_STEPS),
            ",".join(COMMIT_STEPS),
        )
    if env.get(NO_ORACLE_CLAIM_ENV) == "1":
        build = replace(build, oracle_claims=False)
        log.critical(
            "%s=1: timestamp oracles in this process start WITHOUT claiming their store, so "
            "a second oracle may serve next to a running one; it exists only to prove that "
            "chaos tests catch that",
            NO_ORACLE_CLAIM_ENV,
        )
    if env.get(LEADER_IGNORES_LEASE_ENV) == "1":
        build = replace(build, leader_checks_lease=False)
        log.critical(
            "%s=1: a leading replica in this process serves WITHOUT checking that its leader "
            "lease is valid, so after a pause it serves next to the new leader; it exists "
            "only to prove that chaos tests catch that",
            LEADER_IGNORES_LEASE_ENV,
        )
    return build
