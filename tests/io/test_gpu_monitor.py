"""The GPU monitor is import-guarded: on a machine without an NVIDIA driver it is unavailable, says
why, and samples nothing (training goes on). The CUDA_VISIBLE_DEVICES reading is checked directly."""

import pytest

from dockyard.io.gpu_monitor import GpuMonitor, visible_devices


def test_visible_devices_keeps_slurm_ids_and_uuids():
    assert visible_devices(None) is None
    assert visible_devices("2,3") == ["2", "3"]      # Slurm without cgroups: ids need not start at 0
    assert visible_devices("GPU-1a2b, MIG-9") == ["GPU-1a2b", "MIG-9"]
    assert visible_devices("") == []


def test_without_a_driver_the_monitor_says_why_and_samples_nothing():
    pytest.importorskip("pynvml")
    try:
        import pynvml
        pynvml.nvmlInit()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    monitor = GpuMonitor()
    assert not monitor.available
    assert "NVML" in monitor.reason
    assert monitor.sample() == {}


def test_without_the_package_the_reason_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    monitor = GpuMonitor()
    assert not monitor.available and "dockyard[gpu]" in monitor.reason and monitor.sample() == {}
