"""``python -m percolake.chaos._inner RUN-CONFIG``: the run, inside its own namespace."""

import sys

from percolake.chaos._run import main_inner

sys.exit(main_inner(sys.argv[1]))
