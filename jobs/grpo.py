"""Trainer-rank entry point inside an allocation (srun runs one per rank; `dockyard run` does the
same locally). Reads DOCKYARD_CONFIG, DOCKYARD_ENGINE_URL and the torch.distributed variables."""

import sys

from dockyard.loop.grpo import main

if __name__ == "__main__":
    sys.exit(main())
