"""policy.lora: peft adapters on the configured modules, only they train; the servers get the merged
model (and produce the adapted model's logprobs); checkpoints hold the adapters and resume exactly;
the reference policy is the base model with the adapters off."""

import json

import pytest
import torch
from safetensors.torch import load_file

from dockyard import registry
from dockyard.config import load_config
from dockyard.generation.engine import Engine
from dockyard.io.checkpoint import CheckpointManager
from dockyard.policy.samples import Sample
from dockyard.policy.lora import BaseModelReference
from tests.conftest import run_cli

LORA = ["policy.lora.enabled=true", "policy.lora.rank=4", "policy.lora.target_modules=[q_proj,v_proj,down_proj]",
        "policy.optimizer.lr=1e-2"]


def build(world, tiny_model, *overrides):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", *LORA, *overrides]).config
    torch.manual_seed(0)
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=world, device=torch.device("cpu"),
                            total_optimizer_steps=4)
    return cfg, policy


def samples():
    generator = torch.Generator().manual_seed(5)
    return [Sample(token_ids=torch.randint(3, 500, (14,), generator=generator).tolist(), prompt_length=6,
                   advantage=advantage) for advantage in (1.0, -1.0, 0.5, -0.5)]


def train(cfg, policy, steps=2):
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    for _ in range(steps):
        policy.train_mini_batch(samples(), None, None, loss)


def test_only_the_adapters_train_and_the_servers_get_the_merged_model(single_rank_world, tiny_model):
    cfg, policy = build(single_rank_world, tiny_model)
    trainable = {name for name, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {"q_proj", "v_proj", "down_proj"}
    assert sum(len(group["params"]) for group in policy.optimizer.param_groups) == len(trainable)
    before = {n: t.clone() for n, t in policy.full_state_dict().items()}
    reference = BaseModelReference(policy)
    base_logprobs = reference.logprobs(samples())
    train(cfg, policy)
    after = policy.full_state_dict()
    for name in before:
        if name not in trainable:
            assert torch.equal(before[name], after[name]), f"{name} is frozen but changed"
    assert any(not torch.equal(before[n], after[n]) for n in trainable if ".lora_B." in n)

    sent = policy.serving_weights(torch.float32)
    initial = load_file(str(tiny_model / "model.safetensors"))
    assert set(sent) == set(initial)
    assert any(not torch.equal(sent[n], initial[n]) for n in initial if "q_proj" in n)
    assert all(torch.equal(sent[n], initial[n]) for n in initial if "k_proj" in n or "up_proj" in n)
    engine = Engine(tiny_model, dtype=torch.float32)
    engine.load_weights(sent)
    policy_logprobs = policy.logprobs(samples())
    for sample, mine, served in zip(samples(), policy_logprobs, engine.score([s.token_ids for s in samples()])):
        torch.testing.assert_close(torch.tensor(served[sample.prompt_length - 1:]), mine, rtol=0, atol=1e-4)

    # the reference is still the base model: the adapters are off, whatever they learned
    for got, want in zip(reference.logprobs(samples()), base_logprobs):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert any(not torch.allclose(a, b, atol=1e-3) for a, b in zip(policy_logprobs, base_logprobs))


def test_a_checkpoint_holds_the_adapters_and_resumes_exactly(single_rank_world, tiny_model, tmp_path):
    overrides = [f"checkpointing.checkpoint_dir={tmp_path}", "checkpointing.export_hf=true"]
    cfg, policy = build(single_rank_world, tiny_model, *overrides)
    train(cfg, policy)
    manager = CheckpointManager(cfg.checkpointing, 0, hf_source=cfg.policy.model_name)
    step = manager.save(2, policy.checkpoint_state(), {})
    metadata = torch.distributed.checkpoint.FileSystemReader(str(step / "dcp")).read_metadata()
    saved = {key.removeprefix("model.") for key in metadata.state_dict_metadata if key.startswith("model.")}
    assert saved == {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert json.loads((step / "trainer_state.json").read_text())["contents"]["adapters_only"] is True
    exported = load_file(str(step / "hf" / "model.safetensors"))
    served = policy.serving_weights(torch.float32)
    assert set(exported) == set(served) and all(torch.equal(exported[n], served[n]) for n in served)

    from transformers import AutoModelForCausalLM

    from dockyard.io.checkpoint import load_model_weights

    plain = AutoModelForCausalLM.from_pretrained(tiny_model)   # a KL reference from this step: the merged model
    load_model_weights(step, plain)
    assert all(torch.equal(plain.state_dict()[n], served[n]) for n in served)

    cfg, resumed = build(single_rank_world, tiny_model, *overrides)
    manager.load(step, resumed.checkpoint_state())
    train(cfg, policy, 1)
    train(cfg, resumed, 1)
    for name, tensor in policy.full_state_dict().items():
        assert torch.equal(tensor, resumed.full_state_dict()[name]), name

    result = run_cli("export", "hf", "--checkpoint", str(step), "--out", str(tmp_path / "out"))
    assert result.returncode != 0 and "holds LoRA adapters only" in result.stderr and str(step / "hf") in result.stderr


@pytest.mark.parametrize("override, path", [
    ("policy.dtensor_cfg.tensor_parallel_size=2", "policy.lora.enabled"),
    ("policy.lora.dropout=0.1", "policy.lora.dropout"),
    ("checkpointing.save_state=false", "checkpointing.save_state"),
])
def test_what_lora_is_not_built_with_is_refused_by_name(tiny_model, override, path):
    from dockyard.preflight.components import unsupported

    extra = ["checkpointing.export_hf=true"] if "save_state" in override else []
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", *LORA, override, *extra]).config
    assert [p.path for p in unsupported(cfg)] == [path]


def test_a_target_module_the_model_lacks_is_named(single_rank_world, tiny_model):
    from dockyard.policy.samples import PolicySetupError

    with pytest.raises(PolicySetupError, match="policy.lora.target_modules: .* has no module named qkv_proj"):
        build(single_rank_world, tiny_model, "policy.lora.target_modules=[qkv_proj]")
