"""`python -m dockyard.loop`: one trainer rank of `dockyard run` (loop/entry.py)."""

import sys

from dockyard.loop.entry import local_rank_main

sys.exit(local_rank_main())
