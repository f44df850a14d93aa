"""The verification tools around the product: the chaos harness and its test build of
``percolake serve`` (``chaos``), the history checker (``checker``), the Cassandra
launcher (``cassandra``), and the demos (``demo``, ``pipeline``).

They import the product (:mod:`percolake.serve`) and the building blocks; nothing in the
product imports them. The ``percolake`` command line (:mod:`percolake.cli`) offers them
as commands. Importing this package imports none of its modules.
"""
