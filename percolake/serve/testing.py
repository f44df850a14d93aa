"""Switches of ``percolake serve`` that only test builds set, kept out of
:class:`~percolake.serve.config.ServeConfig`.

The chaos test build (``python -m percolake.tools.chaos.serve``) and tests pass a
:class:`TestBuild` beside the configuration to show that the checks catch what each
switch breaks; the installed command always runs the default, which breaks nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from spark_integration.service import LakehouseServicer
from storage_adapters import KVStore, open_store
from txn import COMMIT_STEPS
from txn.gateway import TransactionServicer


@dataclass(frozen=True)
class TestBuild:
    """What a test build of ``percolake serve`` changes; the default changes nothing."""

    #: Not a test class, though pytest would collect it as one by its name.
    __test__: ClassVar[bool] = False

    #: Commit steps other than ``COMMIT_STEPS``: a deliberately broken protocol.
    commit_steps: tuple[str, ...] = COMMIT_STEPS
    #: False: oracles that do not claim their store, so two serve one (rule S7).
    oracle_claims: bool = True
    #: False: a leading replica serves without checking that its lease is valid.
    leader_checks_lease: bool = True
    #: Opens the store (the chaos build models a store across a network).
    store_opener: Callable[[str], KVStore] = open_store
    #: The transaction and lakehouse servicers, with test fail points in a test build.
    gateway_class: type[TransactionServicer] = TransactionServicer
    lakehouse_class: type[LakehouseServicer] = LakehouseServicer
