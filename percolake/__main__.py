import sys

from percolake.cli import main

sys.exit(main())
