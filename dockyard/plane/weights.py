"""Weight versions for the fleet: the trainer writes each version as one safetensors file in a folder
of its own under data_plane.weights_dir (a file system the workers' nodes see) and then announces it
on the broker; a worker loads the newest between requests (worker.py). A version folder is removed
once no live worker serves it or an older one and a newer one is announced."""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from dockyard.plane.broker import Broker, broker_folder

FILE = "model.safetensors"


def weights_root(cfg) -> Path:
    return Path(cfg.data_plane.weights_dir) if cfg.data_plane.weights_dir else broker_folder(cfg) / "weights"


@dataclass(frozen=True)
class Announcement:
    """One publication. `publication` tells apart two writes of the same version: a resumed trainer
    writes again the versions its killed predecessor had published past its checkpoint, from other
    weights, into the same folder; a worker that served the first must load the second."""
    version: int
    path: str
    publication: str


def announced(broker: Broker) -> Announcement | None:
    """The newest publication, or None before the trainer published one."""
    got = broker.call("reading the weights version", lambda: broker.redis.hmget(
        broker.key("state"), "weights_version", "weights_path", "weights_publication"))
    return None if got[0] is None else Announcement(int(got[0]), got[1], got[2] or "")


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
        publication = uuid.uuid4().hex
        # a version written again after a resume replaces the old one. Moved aside, not deleted in place:
        # a worker that opened the old file reads it whole; one that comes after finds the new folder
        old = self.root / f".v{version}.{publication}.old"
        if folder.exists():
            folder.replace(old)
        partial.replace(folder)
        shutil.rmtree(old, ignore_errors=True)
        b = self.broker
        b.call("announcing weights", lambda: b.redis.hset(b.key("state"), mapping={
            "weights_version": version, "weights_path": str(folder), "weights_publication": publication}))
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
