"""The weights a refit sends: full, in the serving dtype, without the alias of a tied embedding."""

import shutil

import pytest
import torch

from dockyard import registry
from dockyard.config import load_config
from dockyard.generation.engine import Engine
from dockyard.policy.samples import Sample


@pytest.fixture
def tied_model(tiny_model, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = True
    torch.manual_seed(1)
    out = tmp_path / "tied-llama"
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for file in tiny_model.iterdir():
        if "token" in file.name or file.name == "chat_template.jinja":
            shutil.copy(file, out / file.name)
    return out


def trained_once(model, world):
    """The dtensor policy of `model` after one training step."""
    cfg = load_config("grpo_tiny.yaml", [f"policy.model_name={model}"]).config
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=world, device=torch.device("cpu"),
                            total_optimizer_steps=2)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = [Sample(token_ids=[1, 2, 3, 4, 5], prompt_length=2, advantage=a) for a in (1.0, -1.0)]
    policy.train_mini_batch(samples, None, None, loss)
    return policy


def test_serving_weights_leave_out_the_tied_alias_and_the_engine_ties_it(single_rank_world, tied_model):
    policy = trained_once(tied_model, single_rank_world)

    full = policy.full_state_dict()
    sent = policy.serving_weights(torch.bfloat16)
    assert policy.alias_names == {"lm_head.weight"}
    assert set(sent) == set(full) - {"lm_head.weight"}
    for name, tensor in sent.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, full[name].to(torch.bfloat16)), name

    engine = Engine(tied_model, dtype=torch.bfloat16)
    assert not torch.equal(engine.model.lm_head.weight, sent["model.embed_tokens.weight"])
    engine.load_weights(sent)
    assert torch.equal(engine.model.lm_head.weight, sent["model.embed_tokens.weight"])
    assert all(torch.equal(t, sent[n]) for n, t in engine.model.state_dict().items() if n in sent)


def test_untied_models_send_every_weight(single_rank_world, tiny_model):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}"]).config
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=single_rank_world,
                            device=torch.device("cpu"), total_optimizer_steps=2)
    full = policy.full_state_dict()
    sent = policy.serving_weights(torch.float32)
    assert set(sent) == set(full) and all(torch.equal(sent[n], full[n]) for n in full)


def test_a_mixture_of_experts_is_sent_under_its_checkpoint_names_and_the_engine_fuses_them(single_rank_world,
                                                                                         tiny_moe_model):
    """transformers keeps a mixture's experts fused in memory; servers (vLLM) load the checkpoint's
    per-expert names, which the megatron backend's converter writes too, and the engine fuses them back."""
    from safetensors import safe_open

    policy = trained_once(tiny_moe_model, single_rank_world)

    sent = policy.serving_weights(torch.float32)
    with safe_open(str(tiny_moe_model / "model.safetensors"), "pt") as saved:
        assert set(sent) == set(saved.keys())
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in sent
    full = policy.full_state_dict()
    fused = full["model.layers.1.mlp.experts.gate_up_proj"]
    assert torch.equal(sent["model.layers.1.mlp.experts.3.up_proj.weight"], fused[3, fused.shape[1] // 2:])

    engine = Engine(tiny_moe_model, dtype=torch.float32)
    assert not torch.equal(engine.model.state_dict()["model.layers.1.mlp.experts.gate_up_proj"], fused)
    engine.load_weights(sent)
    assert all(torch.equal(t, full[n]) for n, t in engine.model.state_dict().items())
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts.0.gate_proj.weight.* missing"):
        engine.load_weights({n: t for n, t in sent.items() if n != "model.layers.0.mlp.experts.0.gate_proj.weight"})
