"""GRPO entry points inside an allocation.

    python jobs/grpo.py                                   one trainer rank as `dockyard run` starts it
                                                          (DOCKYARD_CONFIG, DOCKYARD_REPLICAS, RANK, ...)
    srun --het-group=0 python jobs/grpo.py --slurm --config RESOLVED.yaml --folder DIR
                                                          one trainer task of a Slurm job (what the
                                                          slurm/*.sbatch templates run; dockyard-submit
                                                          runs the same function through submitit)
"""

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", action="store_true", help="run as a trainer task of a Slurm job")
    parser.add_argument("--config", help="the resolved config (dockyard validate --out FILE)")
    parser.add_argument("--folder", help="job folder on storage every node sees (server logs, rendezvous)")
    args = parser.parse_args()
    if not args.slurm:
        from dockyard.loop.entry import main

        sys.exit(main())
    if not (args.config and args.folder):
        parser.error("--slurm needs --config and --folder")
    from dockyard.launch.job import JobFailed, run_trainer_task_from_config

    try:
        run_trainer_task_from_config(Path(args.config), Path(args.folder))
    except JobFailed as err:
        print(f"dockyard: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
