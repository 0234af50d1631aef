"""What this machine's CPU means for a run on it (`dockyard run` without GPUs): a note, not a refusal."""

from __future__ import annotations

from dockyard.config.schema import MasterConfig
from dockyard.machine import BF16_UNITS, cpu_flags

__all__ = ["bf16_notes", "cpu_flags"]


def bf16_notes(cfg: MasterConfig, flags: set[str] | None) -> list[str]:
    """bf16 settings on a CPU without bf16 units: torch's bf16 matmuls take a slow path there (0.7
    against 35 GFLOP/s in fp32 on an AVX2 EPYC), so a bf16 run is many times slower than fp32."""
    if cfg.cluster.gpus_per_node > 0 or flags is None or flags & BF16_UNITS:
        return []
    settings = [("policy.precision", cfg.policy.precision)]
    if cfg.policy.generation.backend == "vllm":
        settings.append(("policy.generation.vllm_cfg.precision", cfg.policy.generation.vllm_cfg.precision))
    slow = [name for name, value in settings if value == "bf16"]
    if not slow:
        return []
    return [f"{' and '.join(slow)} bf16 on a CPU without AVX512-BF16 or AMX: bf16 matmuls run many times slower "
            f"than fp32 here; {' '.join(f'{name}=fp32' for name in slow)} is faster"]
