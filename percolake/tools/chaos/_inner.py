"""``python -m percolake.tools.chaos._inner RUN-CONFIG``: the run, inside its own namespace."""

import sys

from percolake.tools.chaos._run import main_inner

sys.exit(main_inner(sys.argv[1]))
