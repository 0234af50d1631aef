"""`dockyard run` end to end: 2 trainer ranks over gloo and one engine server process. What a setting
does to the loop is tested in this process (loop_run, tests/run/in_process.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save


PHASES = ("refit", "generate", "reward", "logprobs", "advantages", "train", "checkpoint")


def start_run(workdir: Path, model_dir: Path, *overrides: str, new_session: bool = False) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "dockyard.cli", "run", "--config", "grpo_tiny.yaml",
                             f"models_dir={model_dir.parent}", *overrides], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=new_session)


def run(workdir: Path, model_dir: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    process = start_run(workdir, model_dir, *overrides)
    output, _ = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, output, "")


def final_weights(workdir: Path, step: int) -> dict[str, torch.Tensor]:
    out = workdir / f"weights_{step}.pt"
    dcp_to_torch_save(workdir / "runs" / "grpo_tiny" / "checkpoints" / f"step_{step}" / "dcp", out)
    return torch.load(out, weights_only=False)["model"]


@pytest.fixture(scope="module")
def straight_run(tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("straight")
    result = run(workdir, tiny_model, "grpo.max_num_steps=4", "checkpointing.save_period=2")
    assert result.returncode == 0, result.stdout
    return workdir, result


def test_grpo_tiny_trains_and_writes_tensorboard_metrics_and_a_checkpoint(straight_run, tiny_model):
    workdir, result = straight_run
    logs = workdir / "runs" / "grpo_tiny" / "logs"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logs / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for tag in ("reward/mean", "accuracy", "train/loss", "train/entropy", "train/clip_fraction", "train/grad_norm",
                "train/tokens_per_s", "gen/tokens_per_s", *(f"time/{p}" for p in PHASES)):
        assert tag in scalars, tag
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    lines = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    # the machine the figures come from: printed at the start and in the first line of the start
    from dockyard.machine import machine_summary

    assert lines[0]["machine"] == machine_summary() and "machine" not in lines[1]
    assert f"dockyard: machine: {machine_summary()}" in result.stdout   # stderr is merged into it
    assert "step 4:" in result.stdout and "eta" in result.stdout  # console summary and progress bar
    assert "HTTP Request:" not in result.stdout   # logger.log_level INFO: no line per generation request
    checkpoints = workdir / "runs" / "grpo_tiny" / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_2", "step_4"]
    weights = final_weights(workdir, 4)
    initial = load_file(str(tiny_model / "model.safetensors"))
    assert set(weights) == set(initial)
    assert any(not torch.equal(weights[k], initial[k]) for k in initial), "training did not change the weights"


def test_resume_is_bitwise_exact(straight_run, tiny_model, tmp_path):
    workdir, _ = straight_run
    first = run(tmp_path, tiny_model, "grpo.max_num_steps=2")
    assert first.returncode == 0, first.stdout
    second = run(tmp_path, tiny_model, "grpo.max_num_steps=4")
    assert second.returncode == 0, second.stdout
    assert "resumed from runs/grpo_tiny/checkpoints/step_2 (step 2)" in second.stdout
    straight, resumed = final_weights(workdir, 4), final_weights(tmp_path, 4)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_save_state_false_resumes_both_ranks_from_the_hf_weights_and_says_what_it_lost(straight_run, tiny_model,
                                                                                      tmp_path):
    workdir, _ = straight_run
    hf_only = ("checkpointing.save_state=false", "checkpointing.export_hf=true")
    first = run(tmp_path, tiny_model, "grpo.max_num_steps=2", *hf_only)
    assert first.returncode == 0, first.stdout
    step_2 = tmp_path / "runs" / "grpo_tiny" / "checkpoints" / "step_2"
    assert not (step_2 / "dcp").exists()
    exported, straight = load_file(str(step_2 / "hf" / "model.safetensors")), final_weights(workdir, 2)
    assert set(exported) == set(straight) and all(torch.equal(exported[k], straight[k]) for k in straight)
    second = run(tmp_path, tiny_model, "grpo.max_num_steps=3", *hf_only)
    assert second.returncode == 0, second.stdout
    assert "resumed from runs/grpo_tiny/checkpoints/step_2 (step 2)" in second.stdout
    assert "resumed without the optimizer state (saved with save_state: false)" in second.stdout
    assert (step_2.parent / "step_3" / "hf" / "model.safetensors").is_file()


def test_max_num_epochs_ends_the_run_after_the_last_pass_and_preflight_says_when(loop_run, tmp_path):
    result = loop_run(tmp_path, "grpo.max_num_epochs=1", "grpo.max_num_steps=10", "data.datasets.0.generator.size=8")
    assert "grpo.max_num_epochs=1 ends the run after about step 2 of grpo.max_num_steps=10" in result.output
    assert "passed over 1 time(s) (grpo.max_num_epochs=1); ending after step 2" in result.output
    logs = tmp_path / "runs" / "grpo_tiny"
    assert [json.loads(line)["step"] for line in (logs / "logs" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (logs / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


def test_long_prompts_are_skipped_and_every_trajectory_is_dumped(loop_run, tmp_path):
    # grpo_tiny's prompts render to 22-36 tokens with the tiny tokenizer; 116 of its 256 are over 23
    result = loop_run(tmp_path, "grpo.max_num_steps=2", "data.max_input_seq_length=23", "env.dump_trajectory_path=dump")
    assert "skipping a prompt of" in result.output and "(longer than 23: data.max_input_seq_length" in result.output
    for step in (1, 2):
        rows = [json.loads(line) for line in (tmp_path / "dump" / f"train_step_{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 16   # 4 prompts x 4 samples
        assert all(row["prompt_tokens"] <= 23 and row["response_tokens"] > 0 for row in rows)
        assert {"prompt", "label", "response", "raw_reward", "reward", "status", "seed"} <= set(rows[0])


def test_a_run_with_all_four_loggers_writes_what_each_ones_reader_reads(tiny_model, tmp_path):
    # a process of its own: in the test process the trackers meet the state the logger tests left
    from mlflow.tracking import MlflowClient

    from tests.io.test_loggers import swanlab_scalars, wandb_history

    result = run(tmp_path, tiny_model, "grpo.max_num_steps=2", "logger.wandb_enabled=true",
                 "logger.wandb.mode=offline", "logger.mlflow_enabled=true",
                 f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "logger.swanlab_enabled=true",
                 "logger.swanlab.mode=offline")
    assert result.returncode == 0, result.stdout
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    expected = [json.loads(line)["train/loss"] for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [row["train/loss"] for row in wandb_history(logs)] == pytest.approx(expected)
    run_id = (logs / "mlflow_run_id").read_text()
    history = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_metric_history(run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, pytest.approx(expected[0])), (2, pytest.approx(expected[1]))]
    assert swanlab_scalars(logs)["train/loss"] == pytest.approx({1: expected[0], 2: expected[1]})
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logs / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(expected)


def _wait_for_steps(logs: Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = logs / "metrics.jsonl"
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {count} steps in {timeout} s")


def _interrupt_after(process: subprocess.Popen, logs: Path, steps: int, *signals: int) -> tuple[str, list[int]]:
    """Signals to the run's process group, as a terminal sends Ctrl-C; the output and every child's pid."""
    try:
        _wait_for_steps(logs, steps)
        pids = [child["pid"] for child in json.loads((logs / "processes.json").read_text()).values()]
        for signum in signals:
            os.killpg(process.pid, signum)
            time.sleep(0.05)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return output, pids


def _reaped(pids: list[int]) -> None:
    for pid in pids:   # reaped by the driver: no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_ctrl_c_saves_at_the_next_safe_point_and_the_same_command_resumes(tiny_model, tmp_path):
    overrides = ("grpo.max_num_steps=10000", "checkpointing.save_period=1000", "+policy.env_vars.DOCKYARD_MARK=rank")
    process = start_run(tmp_path, tiny_model, *overrides, new_session=True)
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    _wait_for_steps(logs, 1)
    ranks = json.loads((logs / "processes.json").read_text())
    environ = lambda name: Path(f"/proc/{ranks[name]['pid']}/environ").read_bytes().split(b"\0")   # noqa: E731
    assert b"DOCKYARD_MARK=rank" in environ("trainer rank 1")   # policy.env_vars reach the ranks only
    assert b"DOCKYARD_MARK=rank" not in environ("generation server (embedded)")
    output, pids = _interrupt_after(process, logs, 3, signal.SIGINT)
    assert process.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "SIGINT received; the trainer saves at its next safe point" in output
    saved = int((tmp_path / "runs" / "grpo_tiny" / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert saved >= 3   # not a save_period step: saved because of the Ctrl-C
    assert f"saved step {saved}" in output
    assert f"the last checkpoint is step {saved}" in output and "Run the same command again to resume" in output
    _reaped(pids)
    again = run(tmp_path, tiny_model, "grpo.max_num_steps=" + str(saved + 1))
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"resumed from runs/grpo_tiny/checkpoints/step_{saved} (step {saved})" in again.stdout


def test_a_second_ctrl_c_stops_at_once_and_says_what_is_lost(tiny_model, tmp_path):
    process = start_run(tmp_path, tiny_model, "grpo.max_num_steps=10000", "checkpointing.save_period=2",
                        new_session=True)
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    output, pids = _interrupt_after(process, logs, 3, signal.SIGINT, signal.SIGINT)
    assert process.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "SIGINT received; stopping every process at once; the last checkpoint is step " in output
    _reaped(pids)


def test_a_terminated_driver_stops_its_engine_and_ranks(tiny_model, tmp_path):
    process = start_run(tmp_path, tiny_model, "grpo.max_num_steps=10000", "checkpointing.enabled=false")
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    try:
        _wait_for_steps(logs, 1)
        pids = [child["pid"] for child in json.loads((logs / "processes.json").read_text()).values()]
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert "SIGTERM received; the trainer saves at its next safe point" in output
    assert "checkpointing is disabled: nothing of this run is kept" in output
    _reaped(pids)


@pytest.mark.parametrize("victim,named", [("generation server (embedded)", "generation server (embedded)"),
                                          ("trainer rank 1", "trainer rank 1")])
def test_a_dead_component_ends_the_run_naming_it(tiny_model, tmp_path, victim, named):
    process = start_run(tmp_path, tiny_model, "grpo.max_num_steps=10000", "checkpointing.enabled=false")
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    try:
        _wait_for_steps(logs, 1)
        pid = json.loads((logs / "processes.json").read_text())[victim]["pid"]
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert time.monotonic() - killed < 60
    assert process.returncode != 0
    assert named in output and "exited with status" in output
    assert "log:" in output


@pytest.mark.parametrize("overrides,timeout_s,named", [
    (["+cluster.rollout.env.PYTHONHOME=/nonexistent"], "600", "exited with status 1 before it answered /health"),
    ([], "2", "did not answer /health within 2 s of its start")])
def test_a_server_that_does_not_come_up_ends_the_run_naming_it(tiny_model, tmp_path, overrides, timeout_s, named):
    # the ranks start beside the servers; a server that dies or stays silent while starting still ends
    # the run, named, with every process stopped
    process = subprocess.Popen([sys.executable, "-m", "dockyard.cli", "run", "--config", "grpo_tiny.yaml",
                                f"models_dir={tiny_model.parent}", *overrides], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, DOCKYARD_ENGINE_HEALTH_TIMEOUT_S=timeout_s))
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 3, output[-3000:]
    assert "dockyard run: generation server (embedded) " in output and named in output
    pids = [child["pid"] for child in json.loads((tmp_path / "runs/grpo_tiny/logs/processes.json").read_text()).values()]
    _reaped(pids)


def test_unsupported_features_and_missing_model_are_refused_before_starting(tmp_path):
    result = run(tmp_path, tmp_path / "no-model", "policy.dtensor_cfg.context_parallel_size=2",
                 "policy.dtensor_cfg.tensor_parallel_size=2", "policy.backend=megatron",
                 "generation=vllm", "policy.generation.allow_multimodal_inputs=true",
                 "+policy.megatron_cfg.bf16=false", "+policy.megatron_cfg.pipeline_model_parallel_size=2",
                 "+policy.megatron_cfg.optimizer_cpu_offload=true", "loss_fn.reference_policy_kl_penalty=0.1",
                 "loss_fn.reference_model.hf_path=/no/reference")
    assert result.returncode == 2
    assert "policy.dtensor_cfg.context_parallel_size: context parallelism together with tensor parallelism is " \
           "not built yet" in result.stdout
    assert "policy.generation.allow_multimodal_inputs: nothing in this run carries images" in result.stdout
    assert "loss_fn.reference_model.hf_path: no model folder at" in result.stdout
    assert "policy.megatron_cfg.optimizer_cpu_offload: optimizer CPU offload is not built for the megatron " \
           "backend yet" in result.stdout
    assert "policy.model_name: no model folder at" in result.stdout and "make_tiny_model.py" in result.stdout
    assert "Traceback" not in result.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("setting, mesh", [
    ("tensor_parallel_size", "1 data-parallel x 2 tensor-parallel (FSDP shards over data-parallel; each "
                             "tensor-parallel group is 2 neighbouring ranks)"),
    ("context_parallel_size", "1 data-parallel x 2 context-parallel (FSDP shards over all ranks; each "
                              "context-parallel group is 2 neighbouring ranks splitting the sequence positions)")])
def test_a_model_parallel_run_builds_the_mesh_the_dry_run_plans(tiny_model, tmp_path, setting, mesh):
    overrides = (f"models_dir={tiny_model.parent}", f"policy.dtensor_cfg.{setting}=2")
    plan = subprocess.run([sys.executable, "-c", "import sys; from dockyard.cli import submit_main; "
                           "sys.exit(submit_main())", "--config", "grpo_tiny.yaml", "--nodes", "3", "--dry-run",
                           *overrides], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    planned = [line for line in plan.stdout.splitlines() if line.startswith("trainer mesh: ")]
    assert planned == [f"trainer mesh: 2 rank(s) = {mesh}"], plan.stdout + plan.stderr
    result = run(tmp_path, tiny_model, "grpo.max_num_steps=2", "checkpointing.save_period=2", *overrides[1:])
    assert result.returncode == 0, result.stdout
    assert f"dockyard: {planned[0]}" in result.stdout
    assert "step 2:" in result.stdout and "While redistributing" not in result.stdout
    assert sorted(final_weights(tmp_path, 2)) == sorted(load_file(str(tiny_model / "model.safetensors")))


def test_a_mixture_of_experts_trains_over_expert_parallel_ranks_and_refits_the_engine(tiny_moe_model, tmp_path):
    """megatron with each layer's 4 experts split over 2 ranks (EP 2): every step the experts are gathered
    and sent to the engine under the checkpoint's per-expert names (the engine fuses them back; a wrong
    set ends the run), and the HF export has the model's own names with trained experts."""
    result = run(tmp_path, tiny_moe_model, f"policy.model_name={tiny_moe_model}", "policy.backend=megatron",
                 "policy.megatron_cfg={expert_model_parallel_size: 2}", "cluster.cpu_ranks_per_node=2",
                 "grpo.max_num_steps=2", "checkpointing.save_period=2", "checkpointing.export_hf=true",
                 "loss_fn.entropy_coef=0.01")   # a gradient even when every reward is 0
    assert result.returncode == 0, result.stdout[-3000:]
    assert "the experts over 2 of the data-parallel ranks" in result.stdout and "step 2:" in result.stdout
    step = tmp_path / "runs" / "grpo_tiny" / "checkpoints" / "step_2"
    exported = load_file(str(step / "hf" / "model.safetensors"))
    initial = load_file(str(tiny_moe_model / "model.safetensors"))
    assert set(exported) == set(initial)
    assert all(any(not torch.equal(exported[f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight"],
                                   initial[f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight"]) for e in range(4))
               for layer in range(2))


def test_a_lora_run_trains_adapters_against_the_base_model_and_exports_the_merged_model(loop_run, tiny_model,
                                                                                       tmp_path):
    rows = loop_run(tmp_path, "policy.lora.enabled=true", "policy.optimizer.lr=1e-2", "grpo.max_num_steps=2",
                    "checkpointing.save_period=2", "checkpointing.export_hf=true",
                    "loss_fn.reference_policy_kl_penalty=0.01", f"loss_fn.reference_model.hf_path={tiny_model}",
                    "loss_fn.entropy_coef=0.01").metrics()   # a gradient even when every reward is 0
    # step 1 trains from the base model (B = 0): no KL yet; step 2's adapters moved away from it
    assert [row["step"] for row in rows] == [1, 2] and rows[0]["train/kl_ref"] == 0 < rows[1]["train/kl_ref"]
    step = tmp_path / "runs" / "grpo_tiny" / "checkpoints" / "step_2"
    assert json.loads((step / "trainer_state.json").read_text())["contents"]["adapters_only"] is True
    exported, initial = load_file(str(step / "hf" / "model.safetensors")), load_file(str(tiny_model / "model.safetensors"))
    assert set(exported) == set(initial)
    adapted = {n for n in initial if any(m in n for m in ("q_proj", "k_proj", "v_proj", "o_proj"))}
    assert all(torch.equal(exported[n], initial[n]) for n in set(initial) - adapted)
    assert any(not torch.equal(exported[n], initial[n]) for n in adapted)


def test_grpo_tiny_runs_with_the_identical_reward_filter(loop_run, tmp_path):
    rows = loop_run(tmp_path, "grpo.max_num_steps=2", "grpo.filters.identical_reward=true",
                    "checkpointing.enabled=false").metrics()
    assert all(0.0 <= row["train/kept_fraction"] <= 1.0 for row in rows)
    assert all(row["sampling/dropped_identical_reward"] == 4 - row["sampling/groups_kept"] for row in rows)
    assert all(row["train/kept_fraction"] == row["sampling/groups_kept"] / 4 for row in rows)


def test_validation_accuracy_and_every_answer_are_logged(loop_run, tmp_path):
    from dockyard.config.schema.data import DatasetConfig
    from dockyard.data.datasets import load_prompts

    generator = {"name": "basic_arithmetic", "size": 12, "seed": 99, "min_terms": 2, "max_terms": 2,
                 "min_digits": 1, "max_digits": 1}
    held_out = "{name: held_out, shuffle: false, generator: {" + ", ".join(f"{k}: {v}" for k, v in generator.items()) + "}}"
    loop_run(tmp_path, "grpo.max_num_steps=2", "checkpointing.enabled=false", "grpo.val_at_start=true",
             "grpo.val_period=2", f"data.validation={held_out}")
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    metrics = {line["step"]: line for line in map(json.loads, (logs / "metrics.jsonl").read_text().splitlines())}
    assert sorted(metrics) == [0, 1, 2] and "val/accuracy" not in metrics[1]
    expected = [(p.input, p.label) for p in load_prompts(DatasetConfig(generator=generator))]
    for step in (0, 2):
        answers = [json.loads(line) for line in (logs / "validation" / f"step_{step}.jsonl").read_text().splitlines()]
        assert [(a["prompt"], a["label"]) for a in answers] == expected
        assert all(isinstance(a["response"], str) for a in answers)
        assert metrics[step]["val/accuracy"] == sum(a["reward"] >= 1 for a in answers) / 12
        assert metrics[step]["val/reward"] == pytest.approx(sum(a["reward"] for a in answers) / 12)
    assert not (logs / "validation" / "step_1.jsonl").exists()


def test_validation_samples_at_eval_temperature(loop_run, tmp_path):
    """The shipped configs validate greedily (eval_temperature 0); null reuses the sampling temperature
    (1.0 here), which gives other answers from the same weights."""
    responses = {}
    for value in ("0.0", "null"):
        workdir = tmp_path / value
        loop_run(workdir, "grpo.max_num_steps=1", "checkpointing.enabled=false", "grpo.val_at_start=true",
                 "grpo.val_period=0", f"policy.generation.eval_temperature={value}",
                 "data.validation={name: v, shuffle: false, generator: {name: basic_arithmetic, size: 8, seed: 5}}")
        rows = (workdir / "runs" / "grpo_tiny" / "logs" / "validation" / "step_0.jsonl").read_text().splitlines()
        responses[value] = [json.loads(row)["response"] for row in rows]
    assert len(responses["0.0"]) == len(responses["null"]) == 8
    assert responses["0.0"] != responses["null"]


def test_a_jax_run_trains_refits_its_engine_and_resumes_bitwise(tiny_model, tmp_path):
    """The jax backend through `dockyard run`: one trainer process (2 host devices, data x model = 1 x 2),
    its weights refitted to the engine every step, orbax steps, the same command resumed from step 2
    ending bitwise where an uninterrupted run ends, with the compiled steps in the persistent cache."""
    jax_run = ("policy.backend=jax", "cluster.num_nodes=2", "policy.jax_cfg.mesh.model=2",
               "checkpointing.save_period=2", "checkpointing.export_hf=true")
    plan = subprocess.run([sys.executable, "-c", "import sys; from dockyard.cli import submit_main; "
                           "sys.exit(submit_main())", "--config", "grpo_tiny.yaml", "--nodes", "2", "--dry-run",
                           f"models_dir={tiny_model.parent}", *jax_run[:1], *jax_run[2:]],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    planned = [line for line in plan.stdout.splitlines() if line.startswith("jax trainer mesh: ")]
    assert planned == ["jax trainer mesh: 1 data x 2 model = 2 cpu device(s) in one process"], plan.stdout + plan.stderr
    straight = run(tmp_path / "straight", tiny_model, "grpo.max_num_steps=4", *jax_run)
    assert straight.returncode == 0, straight.stdout
    assert f"dockyard: {planned[0]}" in straight.stdout
    assert "refit of generation server (embedded)" in straight.stdout and "step 4:" in straight.stdout
    first = run(tmp_path / "requeued", tiny_model, "grpo.max_num_steps=2", *jax_run)
    assert first.returncode == 0, first.stdout
    second = run(tmp_path / "requeued", tiny_model, "grpo.max_num_steps=4", *jax_run)
    assert second.returncode == 0, second.stdout
    assert "resumed from runs/grpo_tiny/checkpoints/step_2 (step 2)" in second.stdout
    checkpoints = [folder / "runs" / "grpo_tiny" / "checkpoints" for folder in (tmp_path / "straight",
                                                                               tmp_path / "requeued")]
    assert json.loads((checkpoints[1] / "step_2" / "trainer_state.json").read_text())["contents"]["format"] == "orbax"
    ends = [load_file(str(folder / "step_4" / "hf" / "model.safetensors")) for folder in checkpoints]
    initial = load_file(str(tiny_model / "model.safetensors"))
    assert set(ends[0]) == set(initial) and any(not torch.equal(ends[0][k], initial[k]) for k in initial)
    assert all(torch.equal(ends[0][k], ends[1][k]) for k in initial)
    assert any((checkpoints[1] / "jax_compilation_cache").iterdir())
