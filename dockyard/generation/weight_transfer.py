"""Refit: trainer rank 0 pushes the current weights to every generation replica.

Two paths, chosen per replica (`policy.generation.weight_transfer`, `auto` by default):
- shared memory: for replicas on rank 0's machine. One safetensors file is written to /dev/shm once
  and every such replica loads it (`Generator.load_weights_from_disk`): no socket copy.
- broadcast: for replicas elsewhere. One torch.distributed group of its own (gloo on CPU, NCCL on
  GPU) holds rank 0 and every remote replica; each tensor is broadcast once to all of them.

`FleetRefit` splits a fleet into the two and logs which replica takes which path.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterable

import torch

from dockyard.distributed import dtype_name, weight_sync_group, weight_sync_store
from dockyard.generation.generator import GenerationServerError, Generator


class _Call(threading.Thread):
    """A call that must run while this process takes part in a collective (or alongside others)."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.result, self.error = fn, args, None, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except Exception as err:  # re-raised in the caller's thread
            self.error = err

    def value(self, timeout_s: float | None, what: str = "a weight-update call"):
        """None: no deadline of its own (an HTTP call that carries its own timeout)."""
        self.join(timeout_s)
        if self.is_alive():
            raise GenerationServerError(f"no answer to {what} within {timeout_s:.0f} s")
        if self.error is not None:
            raise self.error
        return self.result


def call_all(replicas: list, method: str, *args, timeout_s: float | None = 600) -> list:
    """`method(*args)` on every replica at once; the first error is raised (after all have answered)."""
    calls = [_Call(getattr(replica, method), *args) for replica in replicas]
    results, first_error = [], None
    for replica, call in zip(replicas, calls):
        try:
            results.append(call.value(timeout_s, f"{method} on {replica.name}"))
        except Exception as err:
            first_error = first_error or err
    if first_error is not None:
        raise first_error
    return results


class WeightBroadcaster:
    """Trainer rank 0's end of the broadcast refit: one side group with every remote replica."""

    def __init__(self, replicas: list[Generator], master_address: str, master_port: int = 0,
                 group_name: str = "weight_sync", backend: str = "gloo", timeout_s: float = 300):
        self.replicas, self.group_name, self.timeout_s = list(replicas), group_name, timeout_s
        world = len(self.replicas) + 1
        # master_port 0: the OS picks a free port on this node, then the replicas are told which
        store = weight_sync_store(master_address, master_port, world, timeout_s)
        calls = [_Call(replica.join_weight_group, master_address, store.port, rank, world, group_name, backend)
                 for rank, replica in enumerate(self.replicas, start=1)]
        self.group = weight_sync_group(master_address, store.port, 0, world, group_name, backend, timeout_s,
                                       store=store)
        for replica, call in zip(self.replicas, calls):
            call.value(timeout_s, f"joining the weight group on {replica.name}")

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        tensors = [(name, tensor.detach().contiguous()) for name, tensor in named_tensors]
        names, dtypes = [n for n, _ in tensors], [dtype_name(t.dtype) for _, t in tensors]
        shapes = [list(t.shape) for _, t in tensors]
        calls = [_Call(replica.receive_weights, self.group_name, names, dtypes, shapes) for replica in self.replicas]
        for _, tensor in tensors:
            self.group.broadcast(tensor, 0).wait()
        for replica, call in zip(self.replicas, calls):
            call.value(self.timeout_s, f"the weight broadcast to {replica.name}")

    def close(self) -> None:
        pass


class SharedMemoryWeights:
    """Trainer rank 0's push to replicas on the same machine: one safetensors file in shared memory
    (/dev/shm), which each replica reads. No socket copy: on a 2-core machine this halves the refit
    of a broadcast, and N replicas cost one write."""

    FILE = "model.safetensors"

    def __init__(self, replicas: list[Generator], folder: str | Path | None = None, timeout_s: float = 600):
        self.replicas, self.timeout_s = list(replicas), timeout_s
        root = Path(folder or ("/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()))
        _remove_orphans(root)
        self.folder = Path(tempfile.mkdtemp(prefix=f"dockyard-weights-{os.getpid()}-", dir=root))
        # vLLM's workers run as the same user; the folder must be readable by them
        os.chmod(self.folder, 0o755)

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        # tied aliases are already left out (DTensorPolicy.serving_weights); the servers tie them
        tensors = {name: tensor.detach().contiguous() for name, tensor in named_tensors}
        partial = self.folder / (self.FILE + ".tmp")
        try:
            save_file(tensors, str(partial))
            partial.replace(self.folder / self.FILE)
        except OSError as err:
            raise GenerationServerError(f"cannot write the weights to {self.folder}: {err} "
                                        "(set policy.generation.weight_transfer: broadcast)") from None
        try:
            call_all(self.replicas, "load_weights_from_disk", self.folder, timeout_s=self.timeout_s)
        finally:
            (self.folder / self.FILE).unlink(missing_ok=True)  # each replica holds its own copy now

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class FleetRefit:
    """Every replica gets the weights after each step, each by the path that suits where it runs."""

    def __init__(self, replicas: list[Generator], hosts: list[str], mode: str, sync_address: str,
                 sync_port: int = 0, backend: str = "gloo", timeout_s: float = 600, log=print):
        if mode == "auto":
            local = [is_this_machine(host) for host in hosts]
        else:
            local = [mode == "shared_memory"] * len(replicas)
        self.paths = {replica.name: "shared_memory" if here else "broadcast" for replica, here in zip(replicas, local)}
        near = [r for r, here in zip(replicas, local) if here]
        far = [r for r, here in zip(replicas, local) if not here]
        self.transfers = []
        if near:
            self.transfers.append(SharedMemoryWeights(near, timeout_s=timeout_s))
        if far:
            self.transfers.append(WeightBroadcaster(far, sync_address, sync_port, backend=backend, timeout_s=timeout_s))
        for replica in replicas:
            log(f"dockyard: refit of {replica.name} by {self.paths[replica.name].replace('_', ' ')}")

    def push(self, weights: dict[str, torch.Tensor]) -> None:
        for transfer in self.transfers:
            transfer.push(weights.items())

    def close(self) -> None:
        for transfer in self.transfers:
            transfer.close()


def _remove_orphans(root: Path) -> None:
    """Folders of trainers that were killed (SIGKILL skips the cleanup) would hold memory until reboot."""
    for folder in root.glob("dockyard-weights-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def is_this_machine(host: str) -> bool:
    """Whether `host` names an address of this machine (bindable here), e.g. 127.0.0.1 or this node's name."""
    try:
        address = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
