"""Trainer-world bootstrap inside a Slurm job without a fixed port.

Rank 0 opens the torch.distributed store on a port the OS picks (so it cannot collide with another
job on the same node) and publishes `{address, port}` in the job folder, which every node sees; the
other ranks wait for that file, with a deadline, then join. The file is named by job id and restart
count, so a requeued run never reads its previous incarnation's port.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from dockyard.errors import ComponentError
from dockyard.waiting import WaitTimeout, wait_until


class RendezvousError(ComponentError, RuntimeError):
    pass


def wait_for_file(path: Path, timeout_s: float, what: str) -> str:
    try:
        return wait_until(lambda: path.is_file() and path.read_text(), timeout_s, f"{what} ({path})")
    except WaitTimeout as err:
        raise RendezvousError(f"{err}; it never appeared") from None


def publish(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def trainer_store(path: Path, rank: int, world_size: int, address: str, timeout_s: float) -> dist.TCPStore:
    if rank == 0:
        store = dist.TCPStore(address, 0, world_size, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        publish(path, {"address": address, "port": store.port})
        return store
    data = json.loads(wait_for_file(path, timeout_s, "trainer rank 0's rendezvous address"))
    return dist.TCPStore(data["address"], data["port"], world_size, is_master=False,
                         timeout=timedelta(seconds=timeout_s))
