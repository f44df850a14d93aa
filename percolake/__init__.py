"""percolake: a Percolator/AtlasDB-style transaction layer for data-lake metadata.

This package is the composition root: the ``percolake`` command line and configuration.
The building blocks live in ``storage_adapters``, ``tso``, ``lockserver``, ``txn`` and
``spark_integration``.
"""

__version__ = "0.1.0"
