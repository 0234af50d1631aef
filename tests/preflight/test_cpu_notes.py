"""A bf16 run on a CPU without bf16 units gets a note naming the settings to change (a real run there
is many times slower than fp32); a CPU with them, a GPU run and an fp32 run get none."""

from pathlib import Path

from dockyard.config import load_config
from dockyard.preflight.cpu import bf16_notes, cpu_flags


def test_the_flags_line_of_a_cpuinfo_file_is_read(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") is None
    assert isinstance(cpu_flags(), set)   # this machine's own


def test_bf16_without_bf16_units_is_noted_with_the_fields_to_change():
    avx2 = {"avx2", "fma"}
    cfg = load_config("grpo_math_smol.yaml", ["models_dir=models"]).config
    assert bf16_notes(cfg, avx2) == ["policy.precision bf16 on a CPU without AVX512-BF16 or AMX: bf16 matmuls run "
                                     "many times slower than fp32 here; policy.precision=fp32 is faster"]
    both = load_config("grpo_math_smol.yaml", ["models_dir=models", "generation=vllm"]).config
    assert "policy.precision and policy.generation.vllm_cfg.precision bf16" in bf16_notes(both, avx2)[0]
    assert bf16_notes(cfg, avx2 | {"amx_bf16"}) == [] and bf16_notes(cfg, None) == []
    fp32 = load_config("grpo_math_smol.yaml", ["models_dir=models", "policy.precision=fp32"]).config
    assert bf16_notes(fp32, avx2) == []


def test_the_machine_is_summarised_with_its_cpu_cores_and_bf16_units(tmp_path: Path):
    from dockyard.machine import machine_summary

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel Xeon Platinum\nflags\t\t: avx2 amx_bf16 avx512_bf16\n")
    assert machine_summary(cpuinfo).startswith("Intel Xeon Platinum, ") and "bf16 units: amx_bf16, avx512_bf16" in \
        machine_summary(cpuinfo)
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: avx2 fma\n")
    assert "bf16 units: none (bf16 is slow on this CPU)" in machine_summary(cpuinfo, gpus=["NVIDIA H200"])
    assert machine_summary(cpuinfo, gpus=["NVIDIA H200"]).endswith("; GPUs: NVIDIA H200")
