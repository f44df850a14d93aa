"""percolake: a Percolator/AtlasDB-style transaction layer for data-lake metadata.

This package is the application on top: the ``percolake`` command line (``cli``),
``percolake serve`` (``server``), the history checker (``checker``), the chaos harness
(``chaos``), the demo (``demo``, ``pipeline``) and the Cassandra launcher
(``cassandra``). The building blocks live in ``storage_adapters``, ``tso``,
``lockserver``, ``txn`` and ``spark_integration``.

Three modules here sit below every building block instead, as ``exceptions`` and
``service`` do in temporalio's SDK: ``errors``, the one error root, which imports
nothing; and the wire layer, ``rpc`` plus the generated ``v1`` (its module path is
fixed by the ``percolake.v1`` package of the ``.proto`` files). ``metrics``, the
Prometheus metrics every building block records into, sits beside ``errors``.
Importing this package imports none of them. The layer contract in ``pyproject.toml``
(``make lint``) keeps them from importing anything above them.
"""

__version__ = "0.1.0"
