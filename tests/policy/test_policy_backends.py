"""Every policy backend honours the Policy interface the same way, and the megatron backend computes
what the dtensor backend computes: the same logprobs, losses and gradient norms on the same weights
and batch (TP 1, TP 2, PP 2 with and without interleaved model chunks, and 2 data-parallel ranks with megatron's distributed optimizer), serving
weights under the HF names, an exact resume from its dist checkpoint and a reference loaded from it
(also into another TP or pipeline layout), and bad input refused by name. Each world is a set of worker
processes (backend_worker.py): megatron's parallel state is per process."""

import shutil
from pathlib import Path

import pytest
import torch

from dockyard.policy.megatron import convert
from tests.policy.parity import assert_resumes_exactly, assert_trains_like, max_diff
from tests.policy.worlds import launch_world

WORKER = Path(__file__).with_name("backend_worker.py")
pytest.importorskip("megatron.core")


def launch(world: int, out: Path, *args: str, timeout: int = 300) -> dict:
    launch_world(world, [str(WORKER), "--out", str(out), *args], timeout)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def tiny_deep_model(tiny_tied_model, tmp_path_factory) -> Path:
    """The tied tiny Llama with 4 layers: 2 pipeline stages x 2 model chunks of one layer each."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.conftest import _with_tiny_tokenizer

    config = AutoConfig.from_pretrained(tiny_tied_model)
    config.num_hidden_layers = 4
    torch.manual_seed(5)
    return _with_tiny_tokenizer(AutoModelForCausalLM.from_config(config), tiny_tied_model,
                                tmp_path_factory.mktemp("models") / "tiny-deep")


@pytest.fixture(scope="module")
def runs(tiny_model, tiny_tied_model, tiny_qwen3_model, tiny_deep_model, tiny_moe_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("backends")
    models = {"llama": tiny_model, "tied": tiny_tied_model, "qwen3": tiny_qwen3_model, "deep": tiny_deep_model,
              "moe": tiny_moe_model}
    results = {}
    for name, model in models.items():
        results[("dtensor", name)] = launch(1, root / f"dtensor-{name}.pt", "--backend", "dtensor", "--model", str(model))
        if name != "deep":
            results[("megatron", name)] = launch(1, root / f"megatron-{name}.pt", "--backend", "megatron",
                                                 "--model", str(model))
    for name in ("llama", "qwen3"):
        results[("megatron-tp2", name)] = launch(2, root / f"tp2-{name}.pt", "--backend", "megatron", "--tp", "2",
                                                 "--model", str(models[name]))
    results[("megatron-dp2", "llama")] = launch(2, root / "dp2-llama.pt", "--backend", "megatron",
                                                "--model", str(tiny_model))
    # expert parallelism: each of the 2 data-parallel ranks holds 2 of the 4 experts, tokens travel to
    # their experts and back with megatron's all-to-all dispatcher
    results[("megatron-ep2", "moe")] = launch(2, root / "ep2-moe.pt", "--backend", "megatron", "--model",
                                              str(tiny_moe_model), "--set=+policy.megatron_cfg.expert_model_parallel_size=2")
    # shared-prompt rows: the batch's four prompts with their two responses each in one row (a wrong mask
    # or position lets a response see its neighbour's tokens and moves its logprobs far past 1e-4)
    shared = [f"--set={setting}" for setting in (
        "policy.dynamic_batching.enabled=true", "policy.dynamic_batching.share_prompts=true",
        "policy.dynamic_batching.max_tokens_per_gpu=64", "policy.max_total_sequence_length=64",
        "policy.generation.max_new_tokens=8")]
    results[("megatron-shared", "llama")] = launch(1, root / "shared-llama.pt", "--backend", "megatron",
                                                   "--model", str(tiny_model), *shared)
    results[("megatron-tp2-shared", "qwen3")] = launch(2, root / "tp2-shared-qwen3.pt", "--backend", "megatron",
                                                       "--tp", "2", "--model", str(tiny_qwen3_model), *shared)
    # two pipeline stages of one layer each: the tied model's output layer is the last stage's copy of the
    # first stage's embedding, kept equal through their summed gradients
    results[("megatron-pp2", "tied")] = launch(2, root / "pp2-tied.pt", "--backend", "megatron", "--pp", "2",
                                               "--model", str(tiny_tied_model))
    results[("megatron-pp2-shared", "qwen3")] = launch(2, root / "pp2-shared-qwen3.pt", "--backend", "megatron",
                                                       "--pp", "2", "--model", str(tiny_qwen3_model), *shared)
    # SFT's loss on conversations, packed into shared rows by megatron, one per row by dtensor
    sft = ["--set=policy.dynamic_batching.enabled=true", "--set=policy.dynamic_batching.max_tokens_per_gpu=64",
           "--set=policy.max_total_sequence_length=64"]
    results[("dtensor", "sft")] = launch(1, root / "dtensor-sft.pt", "--backend", "dtensor", "--model",
                                         str(tiny_model), "--sft", "plain", *sft)
    results[("megatron-packed", "sft")] = launch(1, root / "packed-sft.pt", "--backend", "megatron", "--model",
                                                 str(tiny_model), "--sft", "packed", *sft)
    # plain SGD (megatron's non-distributed optimizer: its distributed one shards Adam only), 2 data-parallel ranks
    sgd = ["--set=policy.optimizer.name=sgd", "--set=policy.optimizer.lr=0.5",
           "--set=+policy.megatron_cfg.use_distributed_optimizer=false"]
    results[("dtensor", "sgd")] = launch(1, root / "dtensor-sgd.pt", "--backend", "dtensor", "--model", str(tiny_model),
                                         *sgd)
    results[("megatron-dp2", "sgd")] = launch(2, root / "dp2-sgd.pt", "--backend", "megatron", "--model",
                                              str(tiny_model), *sgd)
    step = root / "tp2-llama.pt.checkpoints" / "step_1"
    cut = Path(shutil.copytree(step, root / "cut" / "step_1"))
    shard = max((cut / "dist_ckpt").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    results["elsewhere"] = launch(1, root / "elsewhere.pt", "--backend", "megatron", "--model", str(tiny_model),
                                  "--load", str(step), "--truncated", str(cut))
    # interleaved: each stage holds 2 model chunks (virtual stages 0 and 2 on the first, 1 and 3 on the last)
    results[("megatron-vpp", "deep")] = launch(2, root / "vpp-deep.pt", "--backend", "megatron", "--pp", "2",
                                               "--set=+policy.megatron_cfg.virtual_pipeline_model_parallel_size=2",
                                               "--model", str(tiny_deep_model))
    results["elsewhere-vpp"] = launch(1, root / "elsewhere-vpp.pt", "--backend", "megatron", "--model",
                                      str(tiny_deep_model), "--load", str(root / "vpp-deep.pt.checkpoints" / "step_1"))
    results["elsewhere-pp"] = launch(1, root / "elsewhere-pp.pt", "--backend", "megatron", "--model",
                                     str(tiny_tied_model), "--load", str(root / "pp2-tied.pt.checkpoints" / "step_1"))
    return results


@pytest.mark.parametrize("world, model", [("megatron", "llama"), ("megatron", "tied"), ("megatron", "qwen3"),
                                          ("megatron-tp2", "llama"), ("megatron-tp2", "qwen3"),
                                          ("megatron-dp2", "llama"), ("megatron-shared", "llama"),
                                          ("megatron-tp2-shared", "qwen3"), ("megatron-pp2", "tied"),
                                          ("megatron-pp2-shared", "qwen3"), ("megatron-vpp", "deep"),
                                          ("megatron", "moe"), ("megatron-ep2", "moe"), ("megatron-packed", "sft"),
                                          ("megatron-dp2", "sgd")])
def test_megatron_matches_dtensor_on_the_same_weights_and_batch(runs, world, model):
    got, want = runs[(world, model)], runs[("dtensor", model)]
    assert_trains_like(got, want)


@pytest.mark.parametrize("backend, model", [("dtensor", "llama"), ("megatron", "llama"), ("megatron-tp2", "llama"),
                                            ("megatron-dp2", "llama"), ("megatron-pp2", "tied"),
                                            ("megatron-vpp", "deep"), ("megatron-ep2", "moe"), ("megatron-dp2", "sgd")])
def test_every_backend_resumes_exactly_and_loads_a_reference_from_its_checkpoint(runs, backend, model):
    got = runs[(backend, model)]
    assert_resumes_exactly(got)


def test_megatron_packs_sft_conversations_into_shared_rows(runs):
    assert runs[("megatron-packed", "sft")]["rows"] < 8   # eight conversations


def test_a_tp2_checkpoint_loads_as_a_reference_on_one_rank_and_its_optimizer_is_refused_by_name(runs):
    elsewhere, source = runs["elsewhere"], runs[("megatron-tp2", "llama")]
    assert "cut/step_1/dist_ckpt cannot be loaded into this model" in elsewhere["truncated"]
    assert max_diff(elsewhere["reference"], source["after_one"]) <= 1e-5
    assert "'tensor_model_parallel_size': 2" in elsewhere["resumed"]
    assert "loads only into the same tensor-parallel, pipeline and data-parallel layout" in elsewhere["resumed"]


@pytest.mark.parametrize("elsewhere, source", [("elsewhere-pp", ("megatron-pp2", "tied")),
                                               ("elsewhere-vpp", ("megatron-vpp", "deep"))])
def test_a_pipelined_checkpoint_loads_as_a_reference_on_one_rank_and_its_optimizer_is_refused_by_name(
        runs, elsewhere, source):
    elsewhere, source = runs[elsewhere], runs[source]
    assert max_diff(elsewhere["reference"], source["after_one"]) <= 1e-5
    assert "'pipeline_model_parallel_size': 2" in elsewhere["resumed"]


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weight_converter_round_trips_bit_identically(tiny_model, tiny_tied_model, tiny_qwen3_model,
                                                          tiny_moe_model, tmp_path, tp):
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Qwen2Config

    qwen2 = tmp_path / "qwen2"   # q/k/v biases
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 tie_word_embeddings=False)).save_pretrained(qwen2)
    for folder in (tiny_model, tiny_tied_model, tiny_qwen3_model, qwen2, tiny_moe_model):
        hf = load_file(str(folder / "model.safetensors"))
        shape = convert.DecoderShape.of(json.loads((folder / "config.json").read_text()), str(folder))
        shards = [convert.to_megatron(hf, shape, tp, rank) for rank in range(tp)]
        if shape.experts:   # and over 2 expert-parallel ranks, 2 experts each
            shares = [[convert.expert_share(shard, shape, 2, ep_rank) for ep_rank in range(2)] for shard in shards]
            assert all(sum(".local_experts.1." in n for n in s) and not any(".local_experts.2." in n for n in s)
                       for tp_shares in shares for s in tp_shares)
            shards = [convert.all_experts(tp_shares, shape) for tp_shares in shares]
        back = convert.to_hf(shards, shape)
        expected = {n: t for n, t in hf.items() if not (shape.tied and n == "lm_head.weight")}
        assert set(back) == set(expected), folder.name
        assert all(torch.equal(back[n], expected[n]) for n in expected), folder.name


def test_bad_megatron_input_is_refused_by_name_before_training(tiny_model, tmp_path):
    import json

    from dockyard.config import load_config
    from dockyard.policy.megatron.settings import unbuilt
    from dockyard.policy.samples import PolicySetupError

    base = [f"models_dir={tiny_model.parent}", f"policy.model_name={tiny_model}", "policy.backend=megatron",
            "+policy.megatron_cfg.tensor_model_parallel_size=1"]
    problems = {p.path: p.message for p in unbuilt(load_config("grpo_tiny.yaml", base + [
        "+policy.megatron_cfg.pipeline_model_parallel_size=2", "+policy.megatron_cfg.optimizer_cpu_offload=true",
        "+policy.megatron_cfg.no_such_field=3", "policy.optimizer.name=sgd",
        "+policy.megatron_cfg.hidden_size=64",
        "policy.dtensor_cfg.tensor_parallel_size=2"]).config)}
    assert "which the megatron backend does not read" in problems["policy.dtensor_cfg.tensor_parallel_size"]
    assert "policy.megatron_cfg.pipeline_model_parallel_size" not in problems
    assert "optimizer CPU offload is not built" in problems["policy.megatron_cfg.optimizer_cpu_offload"]
    assert "distributed optimizer shards Adam only" in problems["policy.optimizer.name"]
    assert "TransformerConfig" in problems["policy.megatron_cfg.no_such_field"]
    assert "set by dockyard from the model folder" in problems["policy.megatron_cfg.hidden_size"]
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(PolicySetupError, match="gpt2.* the megatron weight converter knows the llama, qwen2, qwen3, qwen3_moe"):
        convert.DecoderShape.of(json.loads((gpt2 / "config.json").read_text()), str(gpt2))
    shape = convert.DecoderShape.of(json.loads((tiny_model / "config.json").read_text()), str(tiny_model))
    with pytest.raises(PolicySetupError, match="tensor_model_parallel_size 3: .* 2 key/value heads"):
        shape.check_split(3, str(tiny_model))
    with pytest.raises(PolicySetupError, match="pipeline_model_parallel_size 3: .* has 2 layers"):
        shape.check_stages(3, str(tiny_model))
    with pytest.raises(PolicySetupError, match="virtual_pipeline_model_parallel_size 2: .* 2 layers, which 2 pipeline "
                                               "stages x 2 model chunks cannot split evenly"):
        shape.check_stages(2, str(tiny_model), 2)
    with pytest.raises(PolicySetupError, match="expert_model_parallel_size 2: .* a dense llama model without experts"):
        shape.check_experts(2, str(tiny_model))


def test_mixtures_of_experts_are_refused_by_name_where_they_are_not_built(tiny_moe_model):
    import json

    from dockyard.policy.samples import PolicySetupError

    config = json.loads((tiny_moe_model / "config.json").read_text())
    shape = convert.DecoderShape.of(config, "moe")
    with pytest.raises(PolicySetupError, match="expert_model_parallel_size 3: moe has 4 experts per layer"):
        shape.check_experts(3, "moe")
    with pytest.raises(PolicySetupError, match="'qwen3_moe' model; the jax weight converter knows the llama, qwen2, "
                                               "qwen3 families"):
        convert.DecoderShape.of(config, "moe", "jax")
    with pytest.raises(PolicySetupError, match=r"mixes dense layers \[1\]"):
        convert.DecoderShape.of({**config, "mlp_only_layers": [1]}, "moe")

    from dockyard.config import load_config
    from dockyard.policy.megatron.settings import upstream_settings

    def settings(*overrides):
        cfg = load_config("grpo_tiny.yaml", [f"policy.model_name={tiny_moe_model}", "policy.backend=megatron",
                                             *overrides]).config
        return upstream_settings(cfg, shape, trainable=True)

    transformer, _, _ = settings("+policy.megatron_cfg.expert_model_parallel_size=2")
    assert (transformer.num_moe_experts, transformer.moe_router_topk, transformer.moe_router_pre_softmax) == (4, 2, False)
    with pytest.raises(PolicySetupError, match="tensor_model_parallel_size 2: megatron-core trains a mixture of experts "
                                               "beside tensor parallelism only with sequence parallelism"):
        settings("+policy.megatron_cfg.tensor_model_parallel_size=2")
    with pytest.raises(PolicySetupError, match="policy.megatron_cfg.sequence_parallel: .* no sequence-parallel norms"):
        settings("+policy.megatron_cfg.sequence_parallel=true")
