"""``python -m percolake.tools.cassandra start|stop|status|fetch``."""

import sys

from percolake.tools.cassandra.launcher import main

sys.exit(main())
