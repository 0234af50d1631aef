"""What this machine is, as a run's figures depend on it: the CPU model, its cores and whether it has bf16
units (the same main job differed by 4 points of accuracy at step 40 between two CPUs). A run prints it
at its start and writes it into the first line of metrics.jsonl of every (re)start."""

from __future__ import annotations

import os
from pathlib import Path

BF16_UNITS = {"avx512_bf16", "amx_bf16"}


def _cpuinfo(cpuinfo: Path) -> str:
    try:
        return cpuinfo.read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    for line in _cpuinfo(cpuinfo).splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    for line in _cpuinfo(cpuinfo).splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "an unknown CPU"


def machine_summary(cpuinfo: Path = Path("/proc/cpuinfo"), gpus: list[str] | None = None) -> str:
    """One line: CPU model, cores, bf16 units (and the GPUs, where given)."""
    units = sorted((cpu_flags(cpuinfo) or set()) & BF16_UNITS)
    text = (f"{cpu_model(cpuinfo)}, {os.cpu_count() or 1} cores, bf16 units: "
            f"{', '.join(units) if units else 'none (bf16 is slow on this CPU)'}")
    return text + (f"; GPUs: {', '.join(gpus)}" if gpus else "")
