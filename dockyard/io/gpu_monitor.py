"""Per-step GPU figures (utilisation, memory, power, temperature) through NVML (nvidia-ml-py).

Import-guarded: without the package, without a driver, or without GPUs the monitor is unavailable,
says why once, and samples nothing. It reports the GPUs this process may use (CUDA_VISIBLE_DEVICES,
which under Slurm need not start at 0 and may hold UUIDs), on the node it runs on.
"""

from __future__ import annotations

import os


def visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of NVML indices or UUIDs; None when unset (all GPUs)."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


class GpuMonitor:
    def __init__(self) -> None:
        self.handles: list[tuple[str, object]] = []
        self.reason = ""
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install 'dockyard[gpu]')"
            return
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            wanted = visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
            if wanted is None:
                wanted = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
            for label, item in enumerate(wanted):
                handle = (pynvml.nvmlDeviceGetHandleByUUID(item) if item.startswith(("GPU-", "MIG-"))
                          else pynvml.nvmlDeviceGetHandleByIndex(int(item)))
                self.handles.append((str(label), handle))
        except pynvml.NVMLError as err:
            self.reason = f"NVML is not usable here: {err}"
            self.handles = []
        if not self.handles and not self.reason:
            self.reason = "no GPU visible to this process"

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def sample(self) -> dict[str, float]:
        figures: dict[str, float] = {}
        for label, handle in self.handles:
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                figures[f"gpu/{label}/util_percent"] = float(util.gpu)
                figures[f"gpu/{label}/memory_used_gib"] = memory.used / 2**30
                figures[f"gpu/{label}/power_w"] = self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                figures[f"gpu/{label}/temperature_c"] = float(
                    self.nvml.nvmlDeviceGetTemperature(handle, self.nvml.NVML_TEMPERATURE_GPU))
            except self.nvml.NVMLError:
                continue   # one unreadable counter (e.g. power on some boards) must not stop training
        return figures
