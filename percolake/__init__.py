"""percolake: a Percolator/AtlasDB-style transaction layer for data-lake metadata.

This package is the application on top: the ``percolake`` command line (``cli``),
``percolake serve`` (``server``), the history checker (``checker``), the chaos harness
(``chaos``), the demo (``demo``, ``pipeline``) and the Cassandra launcher
(``cassandra``). The building blocks live in ``storage_adapters``, ``tso``,
``lockserver``, ``txn`` and ``spark_integration``; below all of them sits ``wire``
(the error root, metrics, channels and the generated ``percolake.v1`` protobuf code).
"""

__version__ = "0.1.0"
