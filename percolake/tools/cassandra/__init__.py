"""A real Apache Cassandra for tests and the ``cassandra://`` store, from Maven Central jars.

See :mod:`percolake.tools.cassandra.launcher`; ``percolake cassandra start|stop|status`` on the
command line.
"""

from percolake.tools.cassandra.launcher import (
    DEFAULT_VERSION,
    CassandraCluster,
    CassandraError,
    CassandraPortTaken,
    ClusterLayout,
    NodeStatus,
    add_cassandra_commands,
    cassandra_home,
    ensure_jars,
    main,
    run_cassandra_command,
    start_on_free_ports,
)

__all__ = [
    "DEFAULT_VERSION",
    "CassandraCluster",
    "CassandraError",
    "CassandraPortTaken",
    "ClusterLayout",
    "NodeStatus",
    "add_cassandra_commands",
    "cassandra_home",
    "ensure_jars",
    "main",
    "run_cassandra_command",
    "start_on_free_ports",
]
