"""Weight versions for the fleet: the trainer writes each version as one safetensors file in a folder
of its own under data_plane.weights_dir (a file system the workers' nodes see) and then announces it
on the broker; a worker loads the newest between requests (worker.py). A version folder is removed
once no live worker serves it or an older one and a newer one is announced."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from dockyard.plane.broker import Broker, broker_folder

FILE = "model.safetensors"


def weights_root(cfg) -> Path:
    return Path(cfg.data_plane.weights_dir) if cfg.data_plane.weights_dir else broker_folder(cfg) / "weights"


def announced(broker: Broker) -> tuple[int, str] | None:
    """The newest version and its folder, or None before the trainer published one."""
    got = broker.call("reading the weights version", lambda: broker.redis.hmget(
        broker.key("state"), "weights_version", "weights_path"))
    return None if got[0] is None else (int(got[0]), got[1])


class WeightPublisher:
    def __init__(self, cfg, broker: Broker):
        self.broker, self.root = broker, weights_root(cfg)
        self.root.mkdir(parents=True, exist_ok=True)
        self.last_seconds = 0.0
        self.last_bytes = 0

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        from safetensors.torch import save_file

        started = time.perf_counter()
        folder = self.root / f"v{version}"
        partial = self.root / f".v{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        partial.chmod(0o755)
        save_file({name: t.detach().contiguous() for name, t in weights.items()}, str(partial / FILE))
        shutil.rmtree(folder, ignore_errors=True)   # a version written again after a resume replaces the old one
        partial.replace(folder)
        b = self.broker
        b.call("announcing weights", lambda: b.redis.hset(b.key("state"), mapping={
            "weights_version": version, "weights_path": str(folder)}))
        self.last_seconds = time.perf_counter() - started
        self.last_bytes = (folder / FILE).stat().st_size
        self.prune(version)

    def in_use(self) -> set[int]:
        b = self.broker
        keys = b.call("listing live workers", lambda: list(b.redis.scan_iter(match=b.key("worker:*"), count=1000)))
        versions = set()
        for key in keys:
            value = b.call("reading a worker's version", lambda: b.redis.hget(key, "version"))
            if value not in (None, "", "-1"):
                versions.add(int(value))
        return versions

    def prune(self, newest: int) -> None:
        """Remove versions older than the oldest a live worker serves (never the newest)."""
        keep_from = min(self.in_use() | {newest})
        for folder in self.root.glob("v*"):
            if folder.name[1:].isdigit() and int(folder.name[1:]) < keep_from:
                shutil.rmtree(folder, ignore_errors=True)
