"""The layer contract (``[tool.importlinter]`` in pyproject.toml) is enforced, not hoped for.

``make lint`` runs ``lint-imports``. These tests run it on the real tree (kept) and
on a skeleton of the same packages with one deliberate violation (broken), so a
contract that forbids nothing would fail here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _layer_modules() -> list[str]:
    """Every module a layers contract names (inside its containers, if it has any)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    modules: list[str] = []
    for contract in config["contracts"]:
        if contract["type"] != "layers":
            continue
        for container in contract.get("containers", [None]):
            for layer in contract["layers"]:
                for name in (part.strip() for part in layer.split("|")):
                    modules.append(name if container is None else f"{container}.{name}")
    return modules


def _engine_forbids() -> list[str]:
    """What the lakehouse engine may not import (its forbidden contract)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [
        c
        for c in config["contracts"]
        if c["type"] == "forbidden" and c["source_modules"] == ["spark_integration.engine"]
    ]
    forbidden: list[str] = contract["forbidden_modules"]
    assert {"pyspark", "grpc", "wire.v1"} <= set(forbidden)
    return forbidden


def _run(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "400"}  # no wrapped lines
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(cwd / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _skeleton(root: Path, modules: list[str]) -> None:
    """Empty packages and modules for ``modules``, the real config and the private-modules
    contract type it registers (``tests/import_contracts.py``)."""
    (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for name in [*modules, "tests.import_contracts"]:
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            package = root.joinpath(*parts[:depth])
            if depth < len(parts) or len(parts) == 1:
                package.mkdir(exist_ok=True)
                (package / "__init__.py").touch()
            elif not package.is_dir():
                package.with_suffix(".py").touch()
    contract = ROOT / "tests" / "import_contracts.py"
    (root / "tests" / "import_contracts.py").write_text(contract.read_text())


def test_the_tree_keeps_the_layer_contract() -> None:
    result = _run(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "imports"),
    [
        ("storage_adapters.bad", "txn"),  # the store layer reaching up into transactions
        ("percolake.errors_helper", "wire.channels"),  # see below: the root imports nothing
        ("txn.bad", "spark_integration"),
        ("tso.bad", "txn"),
        # Inside percolake: the product never imports its tools; a replica's control
        # plane sits below the server that runs it.
        ("percolake.serve.bad", "percolake.tools"),
        ("percolake.serve.replica", "percolake.serve.running"),
        # Inside spark_integration: the engine below the service below the Spark side.
        ("spark_integration.engine", "spark_integration.service"),
        ("spark_integration.service", "spark_integration.spark"),
        # And the engine free of what its forbidden contract names (Spark, gRPC...).
        *(("spark_integration.engine", name) for name in _engine_forbids()),
    ],
)
def test_a_lower_layer_importing_a_higher_one_breaks_the_lint(
    tmp_path: Path, module: str, imports: str
) -> None:
    """A skeleton with every layer's package and one upward import: lint-imports fails."""
    _skeleton(tmp_path, [*_layer_modules(), module])
    if module == "percolake.errors_helper":
        # The root layer is one module; make the violation inside it.
        module = "wire.errors"
    target = tmp_path.joinpath(*module.split("."))
    target = target / "__init__.py" if target.is_dir() else target.with_suffix(".py")
    target.write_text(f"import {imports}\n")
    result = _run(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert f"{module} -> {imports}" in result.stdout


@pytest.mark.parametrize(
    ("module", "imports", "reported"),
    [
        # Another package's private module, from product code.
        ("txn.bad", ["tso._lease"], "txn.bad -> tso._lease (private to tso)"),
        # A sub-package's private module, from a sibling sub-package.
        (
            "spark_integration.spark.bad",
            ["spark_integration.engine._catalog"],
            "private to spark_integration.engine",
        ),
        # A test reaching into the internals of two packages.
        (
            "tests.unit.test_bad",
            ["txn._committer", "tso._lease"],
            "tests.unit.test_bad reaches into 2 packages",
        ),
    ],
)
def test_importing_another_packages_private_module_breaks_the_lint(
    tmp_path: Path, module: str, imports: list[str], reported: str
) -> None:
    """Issue 29: 24 imports of other packages' private modules in source, 83 in tests.
    On that tree, and on a skeleton with one such import, lint-imports fails."""
    _skeleton(tmp_path, [*_layer_modules(), module, *imports])
    target = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    target.write_text("".join(f"import {name}\n" for name in imports))
    result = _run(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "private modules stay private BROKEN" in result.stdout
    assert reported in result.stdout


def test_a_test_may_reach_into_the_one_package_it_tests(tmp_path: Path) -> None:
    _skeleton(tmp_path, [*_layer_modules(), "tests.unit.test_ok", "txn._committer", "txn._retry"])
    target = tmp_path / "tests" / "unit" / "test_ok.py"
    target.write_text("import txn._committer\nimport txn._retry\nimport tso\n")
    result = _run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
