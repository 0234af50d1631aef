"""`dockyard export gguf` on SmolLM2: llama.cpp's converter and llama-quantize make f16 and Q8_0 builds
that validate and generate under llama.cpp what transformers generates; a corrupted file fails
validation naming the tensor."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dockyard.io.gguf_export import GGUFExportError, llama_simple, validate_gguf

REPO = Path(__file__).resolve().parents[2]
SMOL = REPO / "models" / "smollm2-135m-instruct"
PROMPTS = ["The capital of France is", "def add(a, b):", "Water boils at"]
TOKENS = 12


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockyard.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=900, env=env)


@pytest.fixture(scope="module")
def builds(llama_cpp_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf") / "smol"
    result = cli("export", "gguf", "--hf", str(SMOL), "--out", str(out), "--quant", "f16", "--quant", "Q8_0",
                 "--llama-cpp-dir", str(llama_cpp_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validated" in result.stdout
    return {"f16": out.with_name("smol-f16.gguf"), "Q8_0": out.with_name("smol-Q8_0.gguf")}


def hf_greedy(prompt: str) -> tuple[str, str]:
    """transformers' greedy continuation of `prompt`, and its first token's text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOL)
    model = AutoModelForCausalLM.from_pretrained(SMOL, dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=TOKENS, do_sample=False)[0, ids.shape[1]:]
    return tokenizer.decode(out, skip_special_tokens=True), tokenizer.decode(out[:1], skip_special_tokens=True)


def test_both_builds_validate_against_the_hf_weights(builds):
    for quant, path in builds.items():
        summary = validate_gguf(path, SMOL)
        assert summary["architecture"] == "llama"
        assert ("Q8_0" in summary["types"]) == (quant == "Q8_0")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_llama_cpp_generates_the_greedy_continuation_transformers_does(builds, llama_cpp_dir, prompt):
    expected, first = hf_greedy(prompt)
    assert llama_simple(builds["f16"], prompt, TOKENS, llama_cpp_dir).startswith(prompt + expected)
    # Q8_0 rounds every weight, so a near tie between two tokens can go the other way later on; its
    # first token is the same
    assert llama_simple(builds["Q8_0"], prompt, TOKENS, llama_cpp_dir).startswith(prompt + first)


def test_a_nan_in_a_tensor_fails_validation_naming_it(builds, tmp_path):
    from gguf import GGUFReader

    broken = tmp_path / "nan.gguf"
    shutil.copy(builds["f16"], broken)
    tensor = next(t for t in GGUFReader(str(broken)).tensors if t.name == "blk.3.ffn_down.weight")
    with open(broken, "r+b") as handle:
        handle.seek(tensor.data_offset + 2 * 17)
        handle.write(np.array([np.nan], dtype=np.float16).tobytes())
    with pytest.raises(GGUFExportError, match=r"tensor blk\.3\.ffn_down\.weight has non-finite values"):
        validate_gguf(broken)
    result = cli("export", "validate-gguf", str(broken), str(builds["Q8_0"]))
    assert result.returncode == 1 and "blk.3.ffn_down.weight has non-finite" in result.stderr
    assert f"{builds['Q8_0']}: ok" in result.stdout


def test_a_removed_tensor_fails_validation_naming_it(builds, tmp_path):
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(str(builds["f16"]))
    writer = GGUFWriter(str(tmp_path / "missing.gguf"), arch=reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.alignment"):
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             sub_type=field.types[-1] if len(field.types) > 1 else None)
    for tensor in reader.tensors:
        if tensor.name != "blk.5.attn_k.weight":
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFExportError, match=r"tensor blk\.5\.attn_k\.weight is missing"):
        validate_gguf(tmp_path / "missing.gguf")


def test_without_llama_cpp_the_error_says_how_to_prepare_it(tmp_path):
    env = dict(os.environ, DOCKYARD_LLAMA_CPP_DIR=str(tmp_path / "nowhere"))
    result = cli("export", "gguf", "--hf", str(SMOL), "--out", str(tmp_path / "x.gguf"), env=env)
    assert result.returncode == 2 and "bash tools/prepare_llama_cpp.sh" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "x.gguf").exists()


def test_without_the_variable_llama_cpp_is_found_where_install_prepared_it(tmp_path, monkeypatch):
    from dockyard.io.gguf_export import llama_cpp

    monkeypatch.delenv("DOCKYARD_LLAMA_CPP_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    prepared = Path(__file__).resolve().parents[2] / ".cache" / "llama.cpp"
    if (prepared / "build" / "bin" / "llama-quantize").is_file():   # tools/install.sh ran in this checkout
        assert llama_cpp()[0] == prepared / "convert_hf_to_gguf.py"
    # nothing anywhere: every place looked in is named
    import dockyard.io.gguf_export as gguf_export

    monkeypatch.setattr(gguf_export, "__file__", str(tmp_path / "elsewhere" / "dockyard" / "io" / "gguf_export.py"))
    with pytest.raises(GGUFExportError) as failed:
        llama_cpp()
    message = str(failed.value)
    assert f"{tmp_path}/elsewhere/.cache/llama.cpp (tools/install.sh's folder" in message
    assert f"{tmp_path}/.cache/llama.cpp (the current folder's .cache)" in message
    assert "/opt/llama.cpp (the dockyard image's)" in message   # where containers/dockyard.Containerfile puts it
    assert "no convert_hf_to_gguf.py or llama-quantize" in message and "tools/prepare_llama_cpp.sh" in message
