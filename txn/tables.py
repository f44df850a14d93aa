"""The formats percolake keeps in the store beside the data, for tools that read it.

The transactions table (``TXN_TABLE``: ``txn_key(start_ts)`` -> ``encode_outcome``)
is where every commit point lands (rule S1); the garbage-collection state
(``GC_TABLE``/``STATE_KEY``, :class:`GcState`) holds the safe point (rule S8). The
chaos harness, the benchmarks and the tests read and plant these rows directly; the
protocol reads them through :mod:`txn`'s own modules. See docs/design/protocol.md and
docs/design/gc.md.
"""

from txn._safepoint import GC_TABLE, STATE_KEY, GcState, read_state
from txn._status import (
    ABORTED,
    OWN_ABORTED_VALUE,
    TXN_TABLE,
    decode_outcome,
    encode_outcome,
    txn_key,
)

__all__ = [
    "ABORTED",
    "GC_TABLE",
    "OWN_ABORTED_VALUE",
    "STATE_KEY",
    "TXN_TABLE",
    "GcState",
    "decode_outcome",
    "encode_outcome",
    "read_state",
    "txn_key",
]
