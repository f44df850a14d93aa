"""``python -m percolake.tools.s3 start|stop|status|fetch``."""

import sys

from percolake.tools.s3.launcher import main

sys.exit(main())
