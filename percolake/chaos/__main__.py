"""``python -m percolake.chaos run|plan ...``."""

import sys

from percolake.chaos.cli import main

sys.exit(main())
