"""``python -m percolake.tools.chaos run|plan ...``."""

import sys

from percolake.tools.chaos.cli import main

sys.exit(main())
