"""The JAX backend (policy/jax/): the loss menu computes what the torch losses compute, the Policy
contract holds (exact resume, a reference from a step, HF-named serving weights), its logprobs,
losses and gradient norms match the dtensor backend on the same weights and batch (Llama untied and
tied, Qwen2, Qwen3), a data=2 x model=2 mesh that really splits the weights and two processes in one
JAX world train the same steps as one device, a step written by one mesh loads into another, and bad
input is refused by name. Each policy
runs in a worker process (backend_worker.py): a process's JAX fixes its host device count once."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dockyard.algorithms.losses import LossInputs
from dockyard.config import load_config
from dockyard.config.schema.loss import LossConfig
from dockyard.policy.decoder_shape import DecoderShape
from dockyard.policy.samples import PolicySetupError
from tests.conftest import REPO
from tests.policy.parity import assert_resumes_exactly, assert_trains_like, max_diff
from tests.policy.worlds import launch_world

jax = pytest.importorskip("jax")
WORKER = Path(__file__).with_name("backend_worker.py")
MESH_2X2 = ("--set", "policy.jax_cfg.mesh.data=2", "--set", "policy.jax_cfg.mesh.model=2")


def launch(out: Path, *args: str, processes: int = 1) -> dict:
    launch_world(processes, [str(WORKER), "--out", str(out), *args], 300)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def runs(tiny_model, tiny_tied_model, tiny_qwen2_model, tiny_qwen3_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("jax")
    results = {}
    for name, model in {"llama": tiny_model, "tied": tiny_tied_model, "qwen2": tiny_qwen2_model,
                        "qwen3": tiny_qwen3_model}.items():
        for backend in ("dtensor", "jax"):
            results[(backend, name)] = launch(root / f"{backend}-{name}.pt", "--backend", backend, "--model", str(model))
    results[("jax-2x2", "llama")] = launch(root / "mesh.pt", "--backend", "jax", "--model", str(tiny_model), *MESH_2X2)
    # two processes in one JAX world (jax.distributed, gloo), each training its half of the samples
    results[("jax-2-processes", "llama")] = launch(root / "processes.pt", "--backend", "jax", "--model",
                                                   str(tiny_model), "--set", "policy.jax_cfg.mesh.data=2",
                                                   processes=2)
    step = root / "mesh.pt.checkpoints" / "step_1"
    cut = Path(shutil.copytree(step, root / "cut" / "step_1"))
    shard = max((cut / "orbax" / "params").rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0)
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    results["elsewhere"] = launch(root / "elsewhere.pt", "--backend", "jax", "--model", str(tiny_model),
                                  "--load", str(step), "--truncated", str(cut))
    return results


@pytest.mark.parametrize("world, model", [("jax", "llama"), ("jax", "tied"), ("jax", "qwen2"), ("jax", "qwen3"),
                                          ("jax-2x2", "llama"),
                                          ("jax-2-processes", "llama")])
def test_jax_matches_dtensor_on_the_same_weights_and_batch(runs, world, model):
    got, want = runs[(world, model)], runs[("dtensor", model)]
    assert_trains_like(got, want)     # HF names, the tied head left out as dtensor does
    assert max(float((got["serving"][n] - want["serving"][n]).abs().max()) for n in want["serving"]) <= 1e-4


def test_a_2x2_mesh_splits_the_weights_and_trains_the_steps_one_device_trains(runs):
    one, mesh = runs[("jax", "llama")], runs[("jax-2x2", "llama")]
    assert one["shards"]["model.layers.0.mlp.up_proj.weight"] == [(256, 128)]
    # 4 devices: each of the 2 model-axis halves held by both data-axis rows; rows for up_proj, columns for o_proj
    assert mesh["shards"]["model.layers.0.mlp.up_proj.weight"] == [(128, 128)] * 4
    assert mesh["shards"]["model.layers.0.self_attn.o_proj.weight"] == [(128, 64)] * 4
    for mine, theirs in zip(mesh["steps"], one["steps"]):
        for name in ("loss", "grad_norm", "entropy", "clip_fraction"):
            assert mine[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), name
    assert max_diff(mesh["after"], one["after"]) <= 1e-5


@pytest.mark.parametrize("world", ["jax", "jax-2x2", "jax-2-processes"])
def test_the_jax_backend_resumes_exactly_and_loads_a_reference_from_its_checkpoint(runs, world):
    got = runs[(world, "llama")]
    assert_resumes_exactly(got)


def test_a_step_of_a_2x2_mesh_resumes_and_loads_on_one_device_and_a_cut_one_is_refused_by_name(runs):
    elsewhere, source = runs["elsewhere"], runs[("jax-2x2", "llama")]
    assert elsewhere["resumed"] == "resumed"                # orbax reads every array into this run's sharding
    assert max_diff(elsewhere["reference"], source["after_one"]) <= 1e-5
    assert "cut/step_1/orbax/params cannot be loaded into this model" in elsewhere["truncated"]


def _inputs(seed: int, ref: bool = True) -> LossInputs:
    generator = torch.Generator().manual_seed(seed)
    shape = (4, 9)
    old = -torch.rand(shape, generator=generator) * 3
    logprobs = old + torch.randn(shape, generator=generator) * 0.4     # ratios well inside and outside the clips
    mask = (torch.rand(shape, generator=generator) > 0.25).float()
    mask[2] = 0.0                                                       # a sequence with nothing trained
    advantages = torch.randn(shape[0], generator=generator)[:, None].expand(shape).clone()
    reference = old + torch.randn(shape, generator=generator) * 0.3 if ref else None
    entropy = torch.rand(shape, generator=generator) * 2
    return LossInputs(logprobs, old, advantages, mask, reference, entropy)


LOSSES = {
    "clipped_pg": {},
    "clip_higher_dual_clip": {"ratio_clip_min": 0.1, "ratio_clip_max": 0.3, "ratio_clip_c": 1.5},
    "gspo": {"name": "gspo", "ratio_clip_min": 0.05, "ratio_clip_max": 0.08},
    "kl_k1_unbiased": {"reference_policy_kl_penalty": 0.2, "reference_policy_kl_type": "k1", "use_unbiased_kl": True},
    "kl_k2": {"reference_policy_kl_penalty": 0.2, "reference_policy_kl_type": "k2"},
    "kl_k3_entropy_seq_mean": {"reference_policy_kl_penalty": 0.1, "entropy_coef": 0.05,
                               "loss_agg_mode": "seq-mean-token-mean"},
    "gspo_kl_seq_mean": {"name": "gspo", "reference_policy_kl_penalty": 0.1, "loss_agg_mode": "seq-mean-token-mean"},
    "kl_in_reward": {"reference_policy_kl_penalty": 0.3, "kl_in_reward": True},
}


@pytest.mark.parametrize("case", list(LOSSES))
def test_the_jax_losses_compute_what_the_torch_losses_compute(case):
    import jax.numpy as jnp

    from dockyard import registry
    from dockyard.algorithms.losses import aggregate
    from dockyard.policy.jax import losses as jax_losses

    config = LossConfig(**LOSSES[case])
    torch_loss = registry.build("loss", config.name, config=config)
    settings = jax_losses.LossSettings.of(config)
    for seed in range(3):
        inputs = _inputs(seed)
        logprobs = inputs.logprobs.clone().requires_grad_(True)
        per_token, metrics = torch_loss(LossInputs(logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
                                                   inputs.ref_logprobs, inputs.entropy))
        total = aggregate(per_token, inputs.mask, config.loss_agg_mode, 20.0, 4.0)
        total.backward()
        as_jax = {name: jnp.asarray(getattr(inputs, name).numpy()) for name in
                  ("old_logprobs", "advantages", "mask", "ref_logprobs", "entropy")}

        def jax_total(lp):
            tokens, _ = jax_losses.per_token_loss(settings, lp, as_jax["old_logprobs"], as_jax["advantages"],
                                                  as_jax["mask"], as_jax["ref_logprobs"], as_jax["entropy"])
            return jax_losses.aggregate(tokens, as_jax["mask"], settings.loss_agg_mode, 20.0, 4.0)

        lp = jnp.asarray(inputs.logprobs.numpy())
        jax_tokens, jax_metrics = jax_losses.per_token_loss(settings, lp, *[as_jax[n] for n in
                                                            ("old_logprobs", "advantages", "mask", "ref_logprobs",
                                                             "entropy")])
        assert torch.allclose(torch.from_numpy(jax.device_get(jax_tokens).copy()), per_token.detach(), atol=1e-5)
        assert set(jax_metrics) == set(metrics)
        for name in metrics:
            assert torch.allclose(torch.from_numpy(jax.device_get(jax_metrics[name]).copy()),
                                  metrics[name].float(), atol=1e-5), name
        assert float(jax_total(lp)) == pytest.approx(float(total.detach()), abs=1e-5)
        gradient = torch.from_numpy(jax.device_get(jax.grad(jax_total)(lp)).copy())
        assert torch.allclose(gradient, logprobs.grad, atol=1e-5)


def test_the_sft_loss_is_rebuilt_as_the_next_token_likelihood():
    import jax.numpy as jnp

    from dockyard.loop.sft import NextTokenLoss
    from dockyard.policy.jax import losses as jax_losses

    settings = jax_losses.LossSettings.of_loss(NextTokenLoss(), LossConfig())
    inputs = _inputs(0, ref=False)
    tokens, metrics = jax_losses.per_token_loss(settings, jnp.asarray(inputs.logprobs.numpy()), None, None, None)
    assert metrics == {} and torch.allclose(torch.from_numpy(jax.device_get(tokens).copy()), -inputs.logprobs)


def test_bad_jax_input_is_refused_by_name_before_training(tiny_model, tmp_path):
    from dockyard.policy.jax.settings import unbuilt

    base = [f"models_dir={tiny_model.parent}", f"policy.model_name={tiny_model}", "policy.backend=jax"]
    problems = {p.path: p.message for p in unbuilt(load_config("grpo_tiny.yaml", base + [
        "policy.precision=fp16", "policy.lora.enabled=true", "policy.dtensor_cfg.tensor_parallel_size=2",
        "loss_fn.reference_policy_kl_type=k2"]).config)}
    # grpo_tiny plans 2 trainer processes; one device cannot be split between them
    assert "data x model = 1 devices do not divide over the 2 trainer processes" in problems["policy.jax_cfg.mesh"]
    assert "loss scaling" in problems["policy.precision"]
    assert "LoRA is not built for the jax backend" in problems["policy.lora.enabled"]
    assert "set policy.jax_cfg.mesh.model instead" in problems["policy.dtensor_cfg.tensor_parallel_size"]
    assert "loss_fn.reference_policy_kl_type" not in problems     # k2 is built
    other = unbuilt(load_config("grpo_tiny.yaml", [f"policy.model_name={tiny_model}",
                                                   "policy.jax_cfg.mesh.model=2"]).config)
    assert [(p.path, "policy.backend is dtensor" in p.message) for p in other] == [("policy.jax_cfg", True)]
    gpt2 = {"model_type": "gpt2"}
    with pytest.raises(PolicySetupError, match="policy.backend jax: x is a 'gpt2' model; the jax weight converter"):
        DecoderShape.of(gpt2, "x", "jax")
    shape = DecoderShape.of(json.loads((tiny_model / "config.json").read_text()), str(tiny_model), "jax")
    with pytest.raises(PolicySetupError, match="policy.jax_cfg.mesh.model 3: .* 2 key/value heads, which 3 devices"):
        shape.check_split(3, str(tiny_model), "policy.jax_cfg.mesh.model", "devices")


def test_a_mesh_larger_than_the_started_jax_is_refused_by_name():
    """A process whose JAX started with 2 host devices cannot build a 2 x 2 mesh."""
    code = ("import os, jax; jax.devices()\n"
            "from dockyard.distributed import WorldInfo\n"
            "from dockyard.policy.jax.policy import _start_jax\n"
            "_start_jax(4, 'cpu', WorldInfo(rank=0, world_size=1, local_rank=0))\n")
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                            env=env)
    assert result.returncode != 0
    assert "PolicySetupError: policy.jax_cfg.mesh: data x model = 4 devices, and this JAX world has 2 (cpu)" \
        in result.stderr


@pytest.mark.parametrize("remat", [True, False])
def test_remat_recomputes_each_decoder_layer_in_the_backward_pass(tiny_model, remat):
    """In a process of its own: building NNX modules in the test process left pytest's captured stderr
    closed for a later test that runs `dockyard run` in-process."""
    code = ("import json, jax, jax.numpy as jnp, numpy as np\n"
            "from pathlib import Path\n"
            "from dockyard.policy.decoder_shape import DecoderShape\n"
            "from dockyard.policy.jax.params import Weights, hf_tensors\n"
            f"folder = Path('{tiny_model}')\n"
            "shape = DecoderShape.of(json.loads((folder / 'config.json').read_text()), str(folder), 'jax')\n"
            f"weights = Weights(shape, remat={remat})\n"
            "params = weights.from_hf(hf_tensors(folder), str(folder))\n"
            "ids, positions = np.zeros((1, 8), np.int32), np.arange(8, dtype=np.int32)[None]\n"
            "allowed = np.tril(np.ones((8, 8), bool))[None]\n"
            "total = lambda p: weights.model(p).hidden_states(ids, positions, allowed, jnp.float32).sum()\n"
            "program = str(jax.make_jaxpr(jax.grad(total))(params))\n"
            "print('recomputed', program.count('remat') + program.count('checkpoint'), 'layers', shape.layers)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    found = [line.split() for line in result.stdout.splitlines() if line.startswith("recomputed")]
    assert found, result.stdout + result.stderr[-2000:]
    recomputed, layers = int(found[0][1]), int(found[0][3])
    assert (recomputed >= layers) == remat, found


def test_a_token_id_outside_the_vocabulary_is_refused_not_clamped(tiny_model, tmp_path):
    """JAX's gathers clamp an index out of range; the backend refuses such a sample instead of training
    on the vocabulary's last token (torch would fail with an index error)."""
    code = ("import torch\n"
            "from dockyard import registry\n"
            "from dockyard.config import load_config\n"
            "from dockyard.distributed import WorldInfo\n"
            "from dockyard.policy.samples import Sample\n"
            f"cfg = load_config('grpo_tiny.yaml', ['policy.model_name={tiny_model}', 'policy.backend=jax', "
            f"'cluster.num_nodes=2', 'checkpointing.checkpoint_dir={tmp_path}']).config\n"
            "policy = registry.build('policy_backend', 'jax', config=cfg, world=WorldInfo(0, 1, 0), "
            "device=torch.device('cpu'), total_optimizer_steps=1, trainable=False)\n"
            "print(policy.logprobs([Sample(token_ids=[5, 6, 7], prompt_length=1)])[0].shape)\n"
            "policy.logprobs([Sample(token_ids=[5, 6, 512], prompt_length=1)])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert "torch.Size([2])" in result.stdout, result.stdout + result.stderr
    assert "token id 512 is outside" in result.stderr and "vocabulary of 512" in result.stderr, result.stderr[-2000:]
