"""``python -m percolake.chaos.serve ...``: ``percolake serve`` for chaos runs.

Exactly ``percolake serve`` with the same arguments, except that it honours the
test-only switches of :mod:`percolake.chaos.unsafe` (a broken commit protocol,
oracles that do not claim their store), which the installed command never looks at.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from percolake.chaos.unsafe import (
    disable_oracle_claims_if_requested,
    install_broken_protocol_if_requested,
)


def main(argv: Sequence[str] | None = None) -> int:
    from percolake.cli import main as cli_main

    install_broken_protocol_if_requested()
    disable_oracle_claims_if_requested()
    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
