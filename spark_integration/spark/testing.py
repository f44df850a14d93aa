"""Switches for tests only: nothing in the product sets them (``STYLE.md``: test
switches live in a testing module, not in the production configuration)."""

from __future__ import annotations

from spark_integration.spark.merge_arrow import paths_taken as merge_paths

__all__ = ["merge_paths"]
