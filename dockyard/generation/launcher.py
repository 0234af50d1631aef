"""How the embedded engine's server process is started (locally here; the Slurm launcher wraps the
same command in `srun --het-group=1`). Each generation backend's launcher gives the command, the
environment and the Generator client of one replica: `command()`, `environment()`, `client()`."""

from __future__ import annotations

import sys
from pathlib import Path

from dockyard.config.schema import MasterConfig
from dockyard.generation.client import EngineClient
from dockyard.generation.images import ImageGate


class EmbeddedServer:
    """dockyard's own HTTP engine (transformers + KV cache), CPU or one GPU."""

    def __init__(self, config: MasterConfig, model_path: str | None = None, tensor_parallel_size: int | None = None):
        # model_path / tensor_parallel_size: a teacher server (on_policy_distillation) serves its own model
        self.config, self.model_path = config, model_path or config.policy.model_name

    def command(self, port: int, host: str = "127.0.0.1", threads: int = 0, address_file: str | None = None) -> list[str]:
        gen = self.config.policy.generation
        device = gen.embedded_cfg.device
        if device == "auto":
            device = "cuda" if self.config.cluster.gpus_per_node > 0 else "cpu"
        dtype = self.config.policy.precision  # bf16 runs on CPUs too (fast where AMX / AVX512-BF16 exist)
        return [sys.executable, "-m", "dockyard.generation.server", "--model", self.model_path,
                "--host", host, "--port", str(port), "--device", device, "--dtype", dtype,
                "--max-batch-size", str(gen.embedded_cfg.max_batch_size), "--threads", str(threads),
                "--log-level", self.config.logger.log_level] + (
                    ["--address-file", address_file] if address_file else [])

    def environment(self, cpus: str | None = None) -> dict[str, str]:
        return {}   # the engine's threads follow --threads

    def client(self, url: str, name: str, log_path: str | Path | None = None,
               request_timeout_s: float = 3600) -> EngineClient:
        return EngineClient(url, name=name, log_path=log_path, request_timeout_s=request_timeout_s,
                            image_gate=ImageGate.from_generation(self.config.policy.generation))
