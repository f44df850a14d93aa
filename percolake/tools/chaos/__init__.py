"""Jepsen-style chaos runs: real processes, real faults, checked histories.

``percolake chaos run --workload list-append|bank|lakehouse|timestamps --nemesis
kill,pause,...`` starts a cluster of real processes on loopback (store, oracle, lock
server, gateways, client processes; with ``--replicas N`` N replicas of ``percolake
serve`` on the store instead of the oracle and the lock server, and the leader faults
``leader-kill``, ``leader-pause``, ``leader-partition``, ``rolling-restart``; with
``--workload lakehouse --warehouse s3`` a MinIO of the run's own holding the table, and
the faults ``s3-pause`` and ``s3-kill`` on it), injects
faults on a seeded schedule while the clients record every operation, heals
everything, reads the final state and checks the history:

* list-append with ``percolake.tools.checker`` (snapshot isolation or serializable), plus a
  final read that must hold every acknowledged append;
* bank: every full read sums to the total, the final balances add up;
* lakehouse: every version a reader sees is whole, acknowledged commits are kept,
  replays add nothing; on S3, every file the final versions name is in the bucket;
* timestamps (AtlasDB TimeLock's Jepsen test): every timestamp a client received is
  unique and in real-time order, whichever replica served it;
* for every workload, the oracle's timestamps: unique, increasing, across restarts.

The run writes ``history.jsonl`` (or the workload's log), ``report.json`` and
``plot.png`` (not with ``--no-plot``) to its folder. Faults that start or heal late (a
loaded machine) shift the rest of the schedule and the end of the run with them, up to
``MAX_STRETCH`` times the planned duration (``stretched_s`` in the report). See
:mod:`percolake.tools.chaos.cli`.
"""

from percolake.tools.chaos._config import MAX_STRETCH, NEMESES, WORKLOADS, RunConfig
from percolake.tools.chaos.cli import add_chaos_commands, run_chaos_command

__all__ = [
    "MAX_STRETCH",
    "NEMESES",
    "WORKLOADS",
    "RunConfig",
    "add_chaos_commands",
    "run_chaos_command",
]
