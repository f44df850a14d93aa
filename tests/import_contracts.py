"""An import-linter contract type: no package reaches into another package's private modules.

A module whose dotted path has a component starting with ``_`` (``txn._retry``,
``spark_integration.engine._x``) is private to the package holding that component
(``txn``, ``spark_integration.engine``). Modules inside that package may import it;
nothing else in the product may: what other packages need is exported under a public
name. Tests may reach into the internals of the one package they test, never of two:
a test module that needs the private modules of two packages is testing how they fit
together, which the public surface must be able to show.

``pyproject.toml`` registers it (``contract_types``) and ``make lint`` runs it;
``tests/unit/test_layers.py`` shows a deliberate violation breaks it.
"""

from __future__ import annotations

from typing import Any

from importlinter import Contract, ContractCheck, fields, output


def private_owner(module: str) -> str | None:
    """The package a private module belongs to, or None for a public module.

    ``txn._retry`` -> ``txn``; ``txn._retry.inner`` -> ``txn``;
    ``spark_integration.engine._x`` -> ``spark_integration.engine``; ``txn.errors`` -> None.
    """
    parts = module.split(".")
    for depth, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:depth])
    return None


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


class PrivateModulesContract(Contract):
    """Configuration: ``tests``, the package of the test suite (its modules may import the
    private modules of one other package each)."""

    type_name = "private_modules"

    tests = fields.StringField()

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        tests = str(self.tests)
        illegal: list[str] = []
        reached_by_test: dict[str, dict[str, list[str]]] = {}
        for importer in sorted(graph.modules):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                owner = private_owner(imported)
                if owner is None or _inside(importer, owner):
                    continue
                if _inside(importer, tests):
                    package = owner.split(".")[0]
                    reached_by_test.setdefault(importer, {}).setdefault(package, []).append(
                        imported
                    )
                    continue
                illegal.append(f"{importer} -> {imported} (private to {owner})")
        for importer, packages in sorted(reached_by_test.items()):
            if len(packages) > 1:
                reached = "; ".join(
                    f"{package}: {', '.join(modules)}"
                    for package, modules in sorted(packages.items())
                )
                illegal.append(f"{importer} reaches into {len(packages)} packages ({reached})")
        return ContractCheck(kept=not illegal, metadata={"illegal": illegal})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["illegal"]:
            output.print_error(line)
        output.new_line()
        output.print(
            "Export what other packages need under a public name; a test may reach into "
            "the private modules of the one package it tests."
        )
