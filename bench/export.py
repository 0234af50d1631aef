"""Export speed on SmolLM2-135M: DCP checkpoint -> HF folder (`dockyard export hf`) against this disk's
sequential write bandwidth (target: the export writes at >= 50% of it), and GGUF conversion per type.

    python bench/export.py [--quant f16 --quant Q8_0]    (GGUF needs DOCKYARD_LLAMA_CPP_DIR)

The checkpoint is a real one: the model's weights and AdamW state saved by CheckpointManager, as a
run saves them. Figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SMOL = REPO / "models" / "smollm2-135m-instruct"


def disk_write_bandwidth(folder: Path, size_mib: int = 512) -> float:
    """MiB/s of one sequential fsynced write of `size_mib`."""
    block = os.urandom(1 << 20)
    path = folder / "bandwidth.bin"
    started = time.perf_counter()
    with open(path, "wb") as handle:
        for _ in range(size_mib):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return size_mib / seconds


def saved_step(folder: Path) -> Path:
    import torch

    from dockyard.config.schema.checkpointing import CheckpointingConfig
    from dockyard.io.checkpoint import CheckpointManager, TorchModuleState
    from dockyard.models import load_causal_lm

    model = load_causal_lm(SMOL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model(input_ids=torch.arange(8).unsqueeze(0), labels=torch.arange(8).unsqueeze(0)).loss.backward()
    optimizer.step()
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(folder / "ckpt")), rank=0, hf_source=str(SMOL))
    return manager.save(1, TorchModuleState(model, optimizer, None), {"metrics": {}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", action="append", help="GGUF types to time (default f16 and Q8_0)")
    parser.add_argument("--dir", help="where to write (default: a temporary folder on the repo's disk)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dockyard-export-", dir=args.dir or REPO / ".cache"))
    try:
        from dockyard.io.hf_export import export_step

        bandwidth = disk_write_bandwidth(folder)
        step = saved_step(folder)
        started = time.perf_counter()
        out = export_step(step, folder / "hf")
        seconds = time.perf_counter() - started
        written = sum(p.stat().st_size for p in out.iterdir()) / 2**20
        print(f"disk sequential write: {bandwidth:.0f} MiB/s")
        print(f"DCP -> HF export: {written:.0f} MiB in {seconds:.2f} s = {written / seconds:.0f} MiB/s "
              f"({100 * written / seconds / bandwidth:.0f}% of the disk's bandwidth; target >= 50%)")
        if os.environ.get("DOCKYARD_LLAMA_CPP_DIR"):
            from dockyard.io.gguf_export import convert_hf_to_gguf

            for quant in args.quant or ["f16", "Q8_0"]:
                started = time.perf_counter()
                path = convert_hf_to_gguf(out, folder / f"smol-{quant}.gguf", quant)
                print(f"GGUF {quant}: {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - started:.1f} s "
                      "(conversion + validation)")
        else:
            print("GGUF: skipped (DOCKYARD_LLAMA_CPP_DIR not set; bash tools/prepare_llama_cpp.sh)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
