"""Start a gloo world of worker processes, as torchrun would, for the policy tests."""

import os
import subprocess
import sys

from dockyard.distributed import free_port
from tests.conftest import REPO


def launch_world(world: int, command: list[str], timeout: int = 300) -> None:
    """`world` processes of `python *command`, one per rank; fails with every rank's output tail if one fails."""
    port = free_port()
    processes = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=str(REPO))
        processes.append(subprocess.Popen([sys.executable, *command], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
    failed = [(rank, p.returncode) for rank, p in enumerate(processes) if p.returncode]
    assert not failed, f"ranks failed {failed}:\n" + "\n".join(out[-3000:] for out in outputs)
