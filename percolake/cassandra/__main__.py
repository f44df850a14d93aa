"""``python -m percolake.cassandra start|stop|status|fetch``."""

import sys

from percolake.cassandra.launcher import main

sys.exit(main())
