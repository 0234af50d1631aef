"""What a step holds follows save_state / save_optimizer / export_hf, every step resumes, and resume
names what it could not restore; `dockyard export hf` turns any step into a folder transformers loads."""

import json

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from dockyard.config.schema.checkpointing import CheckpointingConfig
from dockyard.io.checkpoint import CheckpointManager, TorchModuleState
from dockyard.models import load_causal_lm
from tests.conftest import run_cli


def trained(model_dir, steps=2):
    torch.manual_seed(0)
    model = load_causal_lm(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=torch.arange(2, 12).unsqueeze(0), labels=torch.arange(2, 12).unsqueeze(0)).loss.backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def save(tmp_path, model_dir, **settings):
    model, optimizer, scheduler = trained(model_dir)
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(tmp_path / "ckpt"), **settings), rank=0,
                                hf_source=str(model_dir))
    manager.save(2, TorchModuleState(model, optimizer, scheduler), {"loaders": [{"offset": 8}], "metrics": {}})
    return model, manager


def resume(manager, model_dir):
    model = load_causal_lm(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = manager.load(manager.latest(), TorchModuleState(model, optimizer, scheduler))
    return model, optimizer, state


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_save_optimizer_false_writes_no_optimizer_shards_and_resume_says_so(tmp_path, tiny_model):
    model, manager = save(tmp_path, tiny_model, save_optimizer=False)
    saved = FileSystemReader(str(tmp_path / "ckpt" / "step_2" / "dcp")).read_metadata().state_dict_metadata
    assert any(k.startswith("model.") for k in saved) and not any(k.startswith("optim") for k in saved)
    restored, optimizer, state = resume(manager, tiny_model)
    assert same_weights(model, restored)
    assert state["loaders"] == [{"offset": 8}] and state["step"] == 2
    assert optimizer.state_dict()["state"] == {}
    assert state["not_restored"] == ["the optimizer state (saved with save_optimizer: false): its moments restart "
                                     "from zero"]


def test_the_full_state_restores_the_optimizer_and_names_nothing(tmp_path, tiny_model):
    _, manager = save(tmp_path, tiny_model)
    _, optimizer, state = resume(manager, tiny_model)
    assert state["not_restored"] == [] and optimizer.state_dict()["state"]


@pytest.mark.parametrize("model_fixture", ["tiny_model", "tiny_tied_model"])
def test_save_state_false_keeps_only_the_hf_folder_and_resumes_from_it_exactly(tmp_path, model_fixture, request):
    model_dir = request.getfixturevalue(model_fixture)
    model, manager = save(tmp_path, model_dir, save_state=False, export_hf=True)
    step = tmp_path / "ckpt" / "step_2"
    assert not (step / "dcp").exists() and (step / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "hf").resolve() == (step / "hf").resolve()
    held = json.loads((step / "trainer_state.json").read_text())["contents"]
    assert held == {"dcp": False, "optimizer": False, "hf": True, "model": str(model_dir.resolve()),
                    "adapters_only": False, "format": "dcp"}
    restored, _, state = resume(manager, model_dir)
    assert same_weights(model, restored)
    assert state["not_restored"] == ["the optimizer state (saved with save_state: false): its moments restart "
                                     "from zero"]


def test_keep_top_k_keeps_the_hf_folders_of_the_steps_it_keeps(tmp_path, tiny_model):
    model, optimizer, scheduler = trained(tiny_model, steps=0)
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(tmp_path), export_hf=True, keep_last=1,
                                                    keep_top_k=1, metric_name="val"), rank=0, hf_source=str(tiny_model))
    for step, val in [(1, 0.9), (2, 0.1), (3, 0.2)]:
        manager.save(step, TorchModuleState(model, optimizer, scheduler), {"metrics": {"val": val}})
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_1", "step_3"]
    assert all((tmp_path / f"step_{n}" / "hf" / "model.safetensors").is_file() for n in (1, 3))
    assert (tmp_path / "hf").resolve() == (tmp_path / "step_3" / "hf").resolve()


def greedy(model, tokenizer_dir, prompts):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    outputs = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        outputs.append(model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist())
    return outputs


@pytest.mark.parametrize("settings", [{}, {"save_state": False, "export_hf": True}], ids=["dcp", "hf-only"])
def test_dockyard_export_hf_loads_in_transformers_and_generates_the_trainers_greedy_tokens(tmp_path, tiny_tied_model,
                                                                                       settings):
    from transformers import AutoModelForCausalLM

    model, _ = save(tmp_path, tiny_tied_model, **settings)
    result = run_cli("export", "hf", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name in ("config.json", "tokenizer.json", "generation_config.json"):
        assert (tmp_path / "out" / name).is_file(), name
    prompts = ["1+1=", "What is 7*8?", "hello"]
    assert greedy(exported, tmp_path / "out", prompts) == greedy(model, tiny_tied_model, prompts)
    assert same_weights(model, exported)


def test_export_hf_names_what_is_wrong(tmp_path, tiny_model):
    result = run_cli("export", "hf", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "not a complete dockyard checkpoint step" in result.stderr
    assert "Traceback" not in result.stderr
    _, _ = save(tmp_path, tiny_model)
    step = tmp_path / "ckpt" / "step_2"
    state = json.loads((step / "trainer_state.json").read_text())
    del state["contents"]
    (step / "trainer_state.json").write_text(json.dumps(state))
    result = run_cli("export", "hf", "--checkpoint", str(step), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "pass --model FOLDER" in result.stderr
    result = run_cli("export", "hf", "--checkpoint", str(step), "--out", str(tmp_path / "out"), "--model",
                     str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "no model folder at" in result.stderr and "Traceback" not in result.stderr


def test_a_broken_hf_only_step_is_named_on_resume(tmp_path, tiny_model):
    from dockyard.io.checkpoint import CheckpointLoadError

    _, manager = save(tmp_path, tiny_model, save_state=False, export_hf=True)
    weights = tmp_path / "ckpt" / "step_2" / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointLoadError, match="model.safetensors cannot be read"):
        resume(manager, tiny_model)
