"""Which pip extra each ``percolake`` command needs, and the error when it is missing.

The end-to-end check (a wheel in a clean venv) is ``tests/integration/test_wheel.py``;
these tests pin the table in-process, where every extra is installed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from percolake import cli

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _needs(*argv: str) -> list[str]:
    return cli.extras_needed(cli._build_parser().parse_args(list(argv)))


@pytest.mark.parametrize(
    ("argv", "extras"),
    [
        (("check", "h.jsonl"), []),
        (("status", "--gateway", "127.0.0.1:1"), []),
        (("serve",), []),
        (("serve", "--store", "sqlite:///x.db"), []),
        (("serve", "txn", "--store", "cassandra://h/ks"), ["cassandra"]),
        (("gc", "--store", "memory://"), []),
        (("gc", "--store", "cassandra://h:9042/ks"), ["cassandra"]),
        (("demo", "--tour"), []),
        (("demo",), ["spark"]),
        (("cassandra", "fetch"), []),
        (("cassandra", "stop", "--dir", "d"), []),
        (("cassandra", "start"), ["cassandra"]),
        (("chaos", "plan", "--workload", "lakehouse", "--out", "o"), []),
        (("chaos", "run", "--workload", "list-append", "--out", "o"), []),
        (("chaos", "run", "--workload", "lakehouse", "--out", "o"), ["spark"]),
        (
            ("chaos", "run", "--workload", "lakehouse", "--cassandra-nodes", "3", "--out", "o"),
            ["spark", "cassandra"],
        ),
        (
            ("chaos", "run", "--workload", "bank", "--store", "cassandra://h/k", "--out", "o"),
            ["cassandra"],
        ),
    ],
)
def test_extras_needed(argv: tuple[str, ...], extras: list[str]) -> None:
    assert _needs(*argv) == extras


def test_every_extra_named_exists_in_pyproject() -> None:
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(cli.EXTRA_MODULES) <= set(optional)


def test_tqdm_is_a_core_dependency() -> None:
    """Fails on the code before issue 30 item 9: ``percolake gc`` imports tqdm, which was
    listed only in the dev extra."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(dep.startswith("tqdm") for dep in deps)


def test_a_missing_extra_is_named_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyspark" else real_find_spec(name, *a),
    )
    assert cli.main(["demo", "--workdir", "/nonexistent/never-made"]) == 2
    err = capsys.readouterr().err
    assert err == "percolake demo needs the 'spark' extra: pip install 'percolake[spark]'\n"


def test_an_unforeseen_missing_extra_module_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*_: object) -> int:
        raise ModuleNotFoundError("No module named 'deltalake'", name="deltalake")

    monkeypatch.setattr(cli, "_run", run)
    assert cli.main(["bench", "--quick"]) == 2
    assert "percolake bench needs the 'bench' extra" in capsys.readouterr().err


def test_a_missing_core_module_is_a_bug_not_an_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(*_: object) -> int:
        raise ModuleNotFoundError("No module named 'nosuchthing'", name="nosuchthing")

    monkeypatch.setattr(cli, "_run", run)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["check", "h.jsonl"])
