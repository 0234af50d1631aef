"""torch.distributed set-up: the trainer world from the environment, and the side group that
carries weights from trainer rank 0 to a generation server (outside the trainer world)."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class WorldInfo:
    rank: int
    world_size: int
    local_rank: int
    model_parallel_size: int = 1   # ranks that split one model (TP); neighbours in rank order

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        """Which share of the data this rank trains on: the ranks of one model-parallel group share one."""
        return self.rank // self.model_parallel_size

    @property
    def data_size(self) -> int:
        return self.world_size // self.model_parallel_size


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_trainer_world(device: torch.device, timeout_s: float = 600, model_parallel_size: int = 1) -> WorldInfo:
    """Join the trainer world described by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    info = WorldInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                     int(os.environ.get("LOCAL_RANK", 0)), model_parallel_size)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group(backend_for(device), rank=info.rank, world_size=info.world_size,
                                timeout=timedelta(seconds=timeout_s))
    return info


def weight_sync_store(master_address: str, master_port: int, world_size: int, timeout_s: float = 300):
    """Trainer rank 0's store for the weight-sync group; port 0 lets the OS pick one (read `.port`)."""
    return dist.TCPStore(master_address, master_port, world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


def weight_sync_group(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
                      backend: str = "gloo", timeout_s: float = 300, store=None):
    """A process group of its own (not the default world): trainer rank 0 is rank 0, servers follow."""
    if store is None:
        store = dist.TCPStore(master_address, master_port, world_size, is_master=(rank == 0),
                              timeout=timedelta(seconds=timeout_s))
    store = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timedelta(seconds=timeout_s))
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world_size)
    raise ValueError(f"unknown weight-sync backend {backend!r} (gloo or nccl)")


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel hands out to outgoing connections and to bind(port 0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


# ports this process handed out: one not bound yet (the trainer's rendezvous port, chosen before the
# broker starts) must not be handed out again to the next server started beside it
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nobody listens on now, for a process started next to listen on. It is taken below the
    kernel's ephemeral range: a port from bind(0) is one any outgoing connection (a gloo pair, an HTTP
    client) may take before the server binds it, which `dockyard run` saw as an engine failing with
    "Address already in use" while the trainer ranks started beside it."""
    low, _ = ephemeral_ports()
    candidates = [port for port in range(max(1024, low - 12000), low) if port not in _HANDED_OUT]
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:200] if candidates else []:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:   # nothing free below the range
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
