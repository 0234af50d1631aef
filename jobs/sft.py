"""SFT entry points inside an allocation: the same two forms as jobs/grpo.py.

    python jobs/sft.py                                    one trainer rank as `dockyard run` starts it
    srun --het-group=0 python jobs/sft.py --slurm --config RESOLVED.yaml --folder DIR

A trainer rank runs the loop its config asks for (dockyard.loop.entry.main picks it: a config with an
`sft` section runs dockyard/loop/sft.py), so this refuses a config without one and then runs
jobs/grpo.py's code.
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    import os

    config = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--config"),
                  os.environ.get("DOCKYARD_CONFIG"))
    if config:
        from dockyard.config.loader import read_resolved

        if read_resolved(config).sft is None:
            print(f"jobs/sft.py: {config} has no sft section; it is not an SFT run (use jobs/grpo.py)",
                  file=sys.stderr)
            sys.exit(2)
    runpy.run_path(str(Path(__file__).with_name("grpo.py")), run_name="__main__")
