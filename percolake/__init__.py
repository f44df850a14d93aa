"""percolake: a Percolator/AtlasDB-style transaction layer for data-lake metadata.

This package is the application on top, in two folders: ``serve`` is what the product
runs (``percolake serve``, the replicas' control plane, ``percolake status``), ``tools``
verifies it (the chaos harness, the history checker, the Cassandra launcher, the demos).
The ``percolake`` command line (``cli``) sits above both. The building blocks live in
``storage_adapters``, ``tso``, ``lockserver``, ``txn`` and ``spark_integration``; below
all of them sits ``wire`` (the error root, metrics, channels and the generated
``percolake.v1`` protobuf code).
"""

__version__ = "0.1.0"
