"""The preflight's table of bad inputs: each is refused by `dockyard-submit --dry-run` and by
`dockyard run` before anything is queued or started, with a message naming the field and the file,
and never a traceback."""

import json
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dockyard.cli import main as dockyard_main
from dockyard.launch.submit import submit_main

Case = namedtuple("Case", "overrides expected")


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _model_copy(tiny_model: Path, tmp: Path) -> Path:
    return Path(shutil.copytree(tiny_model, tmp / "model"))


def _dataset(path) -> list[str]:
    return ["~data.datasets.0.generator", f"data.datasets.0.path='{path}'"]


def missing_dataset(tmp, model):
    return Case(_dataset(tmp / "nowhere.jsonl"), f"data.datasets[0].path: dataset file not found: {tmp}/nowhere.jsonl")


def broken_jsonl_line(tmp, model):
    path = _jsonl(tmp / "d.jsonl", ['{"input": "1+1", "label": "2"}', '{"input": "2+2", "label": '])
    return Case(_dataset(path), f"data.datasets[0].path: {path}:2: not valid JSON")


def unreadable_parquet(tmp, model):
    path = tmp / "d.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    return Case(_dataset(path), f"data.datasets[0].path: {path}: not a readable parquet file")


def missing_input_column(tmp, model):
    path = tmp / "d.parquet"
    pq.write_table(pa.table({"question": ["1+1"], "label": ["2"]}), path)
    return Case(_dataset(path), "data.datasets[0].path: dataset 'arithmetic' row 0: no 'input' column")


def slice_out_of_range(tmp, model):
    path = _jsonl(tmp / "d.jsonl", ['{"input": "1+1", "label": "2"}'] * 3)
    return Case(_dataset(f"{path}@[0:10]"), f"data.datasets[0].path: {path}@[0:10]: the row slice [0:10] is out "
                "of range: the file has 3 rows")


def validation_set_missing_labels(tmp, model):
    path = _jsonl(tmp / "v.jsonl", ['{"input": "1+1"}'])
    return Case([f"+data.validation.path='{path}'"], "data.validation.path: dataset 'train' row 0: no 'label' column")


def generator_that_does_not_build(tmp, model):
    return Case(["data.datasets.0.generator.min_digits=5"], "data.datasets[0].generator: data generator "
                "'basic_arithmetic'")


def model_config_not_json(tmp, model):
    (model / "config.json").write_text('{"model_type": "llama",')
    return Case([], f"policy.model_name: {model}/config.json: not valid JSON")


def truncated_safetensors(tmp, model):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    return Case([], f"policy.model_name: {weights}: truncated")


def sharded_index_missing_a_shard(tmp, model):
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    return Case([], "shards that are missing: model-00002-of-00002.safetensors")


def tokenizer_that_does_not_load(tmp, model):
    (model / "tokenizer.json").write_text("{not json")
    return Case([], f"policy.model_name: the tokenizer in {model} does not load")


def chat_template_that_does_not_render(tmp, model):
    template = tmp / "broken.jinja"
    template.write_text("{% for m in messages %}{{ m.content }")
    return Case([f"policy.generation.chat_template.path='{template}'"],
                f"policy.generation.chat_template.path: {template} does not render a user message")


def incomplete_resume_step(tmp, model):
    (tmp / "old" / "step_3").mkdir(parents=True)
    return Case([f"checkpointing.resume_from='{tmp}/old/step_3'"],
                f"checkpointing.resume_from: {tmp}/old/step_3 is not a complete dockyard checkpoint")


def pointer_to_an_incomplete_step(tmp, model):
    (tmp / "ckpt" / "step_4").mkdir(parents=True)
    (tmp / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4\n")
    return Case([f"checkpointing.checkpoint_dir='{tmp}/ckpt'"],
                f"checkpointing.checkpoint_dir: {tmp}/ckpt/latest_checkpointed_iteration.txt names step 4")


def checkpoint_dir_is_a_file(tmp, model):
    (tmp / "ckpt").write_text("")
    return Case([f"checkpointing.checkpoint_dir='{tmp}/ckpt'"],
                f"checkpointing.checkpoint_dir: {tmp}/ckpt exists and is not a folder")


def log_dir_inside_a_file(tmp, model):
    (tmp / "notes.txt").write_text("")
    return Case([f"logger.log_dir='{tmp}/notes.txt/logs'"], f"logger.log_dir: {tmp}/notes.txt/logs cannot be "
                f"written: {tmp}/notes.txt is not a writable folder")


def sft_conversation_without_a_reply(tmp, model):
    path = _jsonl(tmp / "chat.jsonl", [json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                                {"role": "assistant", "content": "hello"}]}),
                                       json.dumps({"messages": [{"role": "user", "content": "no reply"}]})])
    return Case(["+sft={max_num_steps: 2}", "policy.dynamic_batching={enabled: true, max_tokens_per_gpu: 256}",
                 f"data.datasets=[{{name: chat, path: '{path}', input_key: messages, label_key: null}}]"],
                "data.datasets[0].path: dataset 'chat' row 1: no assistant message, so nothing to train on")


def model_of_a_run_not_trained_yet(tmp, model):
    # a recipe's next stage started before the one whose exported model it trains
    folder = tmp / "runs" / "sft_general" / "checkpoints" / "hf"
    return Case([f"policy.model_name={folder}"], f"policy.model_name: no model folder at {folder} (config.json "
                f"missing): it is the exported model of the dockyard run 'sft_general' ({tmp}/runs/sft_general)")


def megatron_field_no_upstream_class_has(tmp, model):
    return Case(["policy.backend=megatron", "policy.precision=fp32", "policy.megatron_cfg={overlap_grad_reduc: true}"],
                "policy.megatron_cfg.overlap_grad_reduc: no field of megatron-core's TransformerConfig, "
                "DistributedDataParallelConfig, OptimizerConfig has this name")


def megatron_field_of_the_wrong_type(tmp, model):
    return Case(["policy.backend=megatron", "policy.precision=fp32",
                 "policy.megatron_cfg={recompute_granularity: everything}"],
                "policy.megatron_cfg: megatron-core's TransformerConfig refused recompute_granularity")


def megatron_stages_that_do_not_split_the_layers(tmp, model):
    return Case(["policy.backend=megatron", "policy.precision=fp32", "cluster.cpu_ranks_per_node=3",
                 "policy.megatron_cfg={pipeline_model_parallel_size: 3}"],
                f"policy.megatron_cfg.pipeline_model_parallel_size 3: {tmp}/model has 2 layers, which 3 pipeline "
                "stages cannot split evenly")


def jax_mesh_that_does_not_divide_over_the_trainer_processes(tmp, model):
    return Case(["policy.backend=jax", "policy.jax_cfg.mesh.data=3"],
                "policy.jax_cfg.mesh: data x model = 3 devices do not divide over the 2 trainer processes")


def jax_mesh_that_does_not_split_the_model(tmp, model):
    return Case(["policy.backend=jax", "cluster.num_nodes=2", "policy.jax_cfg.mesh.model=3"],
                f"policy.jax_cfg.mesh.model 3: {tmp}/model has 2 key/value heads, which 3 devices cannot split evenly")


CASES = [missing_dataset, broken_jsonl_line, unreadable_parquet, missing_input_column, slice_out_of_range,
         validation_set_missing_labels, generator_that_does_not_build, model_config_not_json, truncated_safetensors,
         sharded_index_missing_a_shard, tokenizer_that_does_not_load, chat_template_that_does_not_render,
         incomplete_resume_step, pointer_to_an_incomplete_step, checkpoint_dir_is_a_file, log_dir_inside_a_file,
         sft_conversation_without_a_reply, model_of_a_run_not_trained_yet, megatron_field_no_upstream_class_has,
         megatron_field_of_the_wrong_type, megatron_stages_that_do_not_split_the_layers, jax_mesh_that_does_not_divide_over_the_trainer_processes, jax_mesh_that_does_not_split_the_model]


@pytest.fixture
def bad_input(request, tiny_model, tmp_path):
    model = _model_copy(tiny_model, tmp_path)
    case = request.param(tmp_path, model)
    return [f"models_dir={tmp_path}", "policy.model_name=${models_dir}/model",
            f"logger.log_dir={tmp_path}/logs", f"checkpointing.checkpoint_dir={tmp_path}/checkpoints",
            *case.overrides], case.expected


@pytest.mark.parametrize("bad_input", CASES, indirect=True, ids=[c.__name__ for c in CASES])
def test_submit_dry_run_and_local_run_refuse_it_naming_field_and_file(bad_input, capsys):
    overrides, expected = bad_input
    assert submit_main(["--config", "grpo_tiny.yaml", "--dry-run", *overrides]) == 2
    err = capsys.readouterr().err
    assert expected in err and "nothing was submitted" in err and "Traceback" not in err, err
    assert dockyard_main(["run", "--config", "grpo_tiny.yaml", *overrides]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    assert not (Path(overrides[2].split("=", 1)[1]) / "config.yaml").exists()   # nothing started


def test_every_problem_is_reported_at_once_and_validate_preflight_agrees(tiny_model, tmp_path, capsys):
    model = _model_copy(tiny_model, tmp_path)
    (model / "config.json").write_text("{")
    overrides = [f"models_dir={tmp_path}", "policy.model_name=${models_dir}/model", *_dataset(tmp_path / "no.jsonl"),
                 f"checkpointing.resume_from='{tmp_path}/nowhere'"]
    assert dockyard_main(["validate", "--preflight", "--config", "grpo_tiny.yaml", *overrides]) == 2
    err = capsys.readouterr().err
    assert "(3 problems)" in err, err
    for field in ("policy.model_name: ", "data.datasets[0].path: ", "checkpointing.resume_from: "):
        assert field in err
    assert dockyard_main(["validate", "--config", "grpo_tiny.yaml", *overrides]) == 0   # without: the schema only


def test_a_disk_without_room_for_the_kept_checkpoints_is_refused(tiny_model, tmp_path, monkeypatch, capsys):
    from collections import namedtuple as usage

    import dockyard.preflight.outputs as outputs

    monkeypatch.setattr(outputs.shutil, "disk_usage", lambda path: usage("u", "total used free")(10**9, 10**9, 1000))
    assert dockyard_main(["run", "--config", "grpo_tiny.yaml", f"models_dir={tiny_model.parent}",
                          f"checkpointing.checkpoint_dir={tmp_path}/ckpt", "checkpointing.keep_last=2"]) == 2
    err = capsys.readouterr().err
    assert "checkpointing.checkpoint_dir: 1000 B free on its disk" in err and "3 kept at once" in err, err


def test_a_new_user_sees_the_same_message_from_the_command_line(tiny_model, tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", ['{"input": "1+1", "label": "2"}', "oops"])
    for command in (["dockyard-submit", "--dry-run"], ["dockyard", "run"]):
        result = subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:], "--config",
                                 "grpo_tiny.yaml", f"models_dir={tiny_model.parent}", *_dataset(path)],
                                capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert result.returncode == 2, result.stderr
        assert f"data.datasets[0].path: {path}:2: not valid JSON" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_generation_servers_tensor_parallel_size_must_split_the_models_heads(tiny_model):
    """vLLM / SGLang refuse a TP size that does not split the attention heads, 25 s into the job; the
    preflight refuses it first, for the rollout servers and for each teacher (SmolLM2: 9 heads, 3 kv)."""
    from dockyard.config import load_config
    from dockyard.preflight import model_problems

    smol = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-instruct"

    def problems(config: str, *overrides: str) -> list[str]:
        cfg = load_config(config, [f"models_dir={tiny_model.parent}", *overrides]).config
        return [str(p) for p in model_problems(cfg)[0]]

    found = problems("grpo_math_smol.yaml", f"policy.model_name={smol}", "generation=vllm",
                     "policy.generation.vllm_cfg.tensor_parallel_size=2")
    assert len(found) == 1 and found[0].startswith("policy.generation.vllm_cfg.tensor_parallel_size: 2 does not "
                                                   "split") and "9 attention heads (3 key/value heads)" in found[0]
    assert "Sizes that do: 1, 3, 9" in found[0]
    assert problems("grpo_math_smol.yaml", f"policy.model_name={smol}", "generation=vllm",
                    "policy.generation.vllm_cfg.tensor_parallel_size=3") == []
    assert problems("grpo_tiny.yaml", "generation=vllm", "policy.generation.vllm_cfg.tensor_parallel_size=2") == []
    # a teacher on the same servers' size: the tiny student splits, the SmolLM2 teacher does not
    from tests.run.test_distillation_run import OPD, TEACHERS_CLUSTER

    teachers = (f"+on_policy_distillation={{teachers: [{{name: alpha, hf_path: {smol}}}]}}", *OPD, *TEACHERS_CLUSTER)
    found = problems("grpo_tiny.yaml", "generation=vllm", "policy.generation.vllm_cfg.tensor_parallel_size=2", *teachers)
    assert len(found) == 1 and "smollm2-135m-instruct's 9 attention heads" in found[0], found
