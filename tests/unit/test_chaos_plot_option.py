"""``percolake chaos run --no-plot``: the option and its place in the run's config. A run
without the plot is in ``tests/chaos/test_chaos.py`` (every run but one there)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from percolake.tools.chaos._config import RunConfig
from percolake.tools.chaos.cli import add_chaos_commands, config_from_args

pytestmark = pytest.mark.unit


def test_no_plot_is_kept_in_the_config_the_run_process_reads(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_chaos_commands(parser.add_subparsers(dest="command"))
    run = ["chaos", "run", "--workload", "list-append", "--out", str(tmp_path)]
    assert config_from_args(parser.parse_args(run)).plot is True
    config = config_from_args(parser.parse_args([*run, "--no-plot"]))
    assert config.plot is False
    # The run itself happens in another process, which reads the config back.
    config.dump(tmp_path / "run-config.json")
    assert RunConfig.load(tmp_path / "run-config.json").plot is False
