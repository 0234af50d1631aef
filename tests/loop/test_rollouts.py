"""The step's sampler on rank 0 (RolloutCollector) against a real engine server, the tiny model's
tokenizer and the real math environment: retries, the status filter, dynamic sampling with refill
and oversampling."""

import threading
import time

from dockyard.config import load_config
from dockyard.data.datasets import PromptLoader, build_messages, load_prompts, prompt_token_ids
from dockyard.envs.math import MathEnvironment
from dockyard.generation.client import EngineClient
from dockyard.generation.engine import SamplingParams
from dockyard.loop.rollouts import RolloutCollector
from dockyard.models import load_tokenizer


class FlakyMath(MathEnvironment):
    """The math environment with a scorer that raises for chosen prompts on their first `failures` scorings
    (or always, with failures=None)."""

    def __init__(self, config, failing: set[str], failures: int | None):
        super().__init__(config)
        self.failing, self.failures, self.calls = failing, failures, {}

    def score(self, completion, prompt):
        key = str(prompt.input)
        if key in self.failing:
            self.calls[key] = self.calls.get(key, 0) + 1
            if self.failures is None or self.calls[key] <= self.failures:
                raise RuntimeError(f"scorer crashed on {key!r}")
        return super().score(completion, prompt)


class SlowMath(MathEnvironment):
    """The math environment whose scorer takes `seconds` (a chosen prompt: `hang` seconds), counting how
    many scorings run at once."""

    def __init__(self, config, seconds: float, hanging: str | None = None, hang: float = 0.0):
        super().__init__(config)
        self.seconds, self.hanging, self.hang = seconds, hanging, hang
        self.lock, self.running, self.most = threading.Lock(), 0, 0

    def score(self, completion, prompt):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.hang if str(prompt.input) == self.hanging else self.seconds)
        finally:
            with self.lock:
                self.running -= 1
        return super().score(completion, prompt)


def collector(engine_server, tiny_model, *overrides, env=None, failing=(), failures=None):
    url, _ = engine_server
    # a flaky scorer's failures go to the trajectories in scoring order: one worker keeps that order fixed
    overrides = (*overrides, "env.num_workers=1") if failing else overrides
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", *overrides]).config
    tokenizer = load_tokenizer(tiny_model)
    loaders = [PromptLoader(load_prompts(d), d.shuffle, cfg.policy.seed) for d in cfg.data.datasets]
    if env is not None:
        env = env(cfg.env)
    else:
        env = FlakyMath(cfg.env, set(failing), failures) if failing else MathEnvironment(cfg.env)
    client = EngineClient(url)
    calls = []

    def generate(ids, params):
        calls.append((len(ids), params.n))
        return client.generate(ids, params)

    made = RolloutCollector(
        cfg, env, loaders, generate=generate,
        prompt_ids=lambda p: prompt_token_ids(tokenizer, build_messages(p, None, env.instruction)),
        sampling=lambda lengths, n, seed: SamplingParams(n=n, max_tokens=6, temperature=1.0, seed=seed),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    return made, loaders, calls


def first_prompts(tiny_model, count):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}"]).config
    loader = PromptLoader(load_prompts(cfg.data.datasets[0]), cfg.data.datasets[0].shuffle, cfg.policy.seed)
    return [str(p.input) for p in loader.take(count)]


def test_a_failed_trajectory_is_sampled_again_and_recovers(engine_server, tiny_model):
    first = first_prompts(tiny_model, 1)[0]
    made, _, calls = collector(engine_server, tiny_model, "grpo.retry_limit=3", failing={first}, failures=6)
    groups, metrics = made.collect(seed=1)
    assert len(groups) == 4 and all(len(g.trajectories) == 4 for g in groups)
    retried = groups[0].trajectories
    # the first prompt's 6 first scorings fail: all 4 trajectories, then 2 of the 4 retries
    assert [t.attempts for t in retried] == [3, 3, 2, 2] and all(t.status == "ok" for t in retried)
    assert calls == [(4, 4), (4, 1), (2, 1)]
    assert metrics["sampling/retried_trajectories"] == 4 and metrics["sampling/failed_trajectories"] == 0
    assert all(t.attempts == 1 for g in groups[1:] for t in g.trajectories)


def test_the_status_filter_drops_a_group_whose_trajectory_failed_every_attempt(engine_server, tiny_model):
    first = first_prompts(tiny_model, 1)[0]
    made, _, calls = collector(engine_server, tiny_model, "grpo.retry_limit=2", failing={first})
    groups, metrics = made.collect(seed=1)
    assert len(groups) == 3 and first not in [str(g.prompt.input) for g in groups]
    assert metrics["sampling/failed_trajectories"] == 4 and metrics["sampling/dropped_status"] == 1
    assert calls == [(4, 4), (4, 1)]  # retry_limit 2: one more attempt each


def test_without_the_status_filter_a_failed_trajectory_trains_with_reward_zero(engine_server, tiny_model):
    first = first_prompts(tiny_model, 1)[0]
    made, _, _ = collector(engine_server, tiny_model, "grpo.retry_limit=1", "grpo.filters.status=false",
                           "grpo.invalid_action_penalty=-1", failing={first})
    groups, _ = made.collect(seed=1)
    assert len(groups) == 4
    failed = groups[0].trajectories
    assert all(t.status == "failed" and t.raw_reward == 0.0 and t.reward == 0.0 and t.attempts == 1 for t in failed)


def test_dynamic_sampling_refills_until_the_step_has_its_groups(engine_server, tiny_model):
    # the tiny random model rarely answers right: most groups are all-zero and dropped
    made, loaders, calls = collector(engine_server, tiny_model, "grpo.filters.identical_reward=true",
                                     "grpo.sampler.dynamic_sampling=true", "grpo.sampler.refill_ratio=2",
                                     "grpo.sampler.max_refill_count=6", "grpo.sampler.max_refill_rounds=50")
    groups, metrics = made.collect(seed=3)
    assert len(groups) == 4
    assert all(len({t.reward for t in g.trajectories}) > 1 for g in groups)
    assert metrics["sampling/refills"] >= 1 and metrics["sampling/groups_kept"] == 4
    # refill sizes: min(ceil(missing x 2), 6), so never more than 6 prompts per refill
    assert calls[0] == (4, 4) and all(count <= 6 for count, _ in calls[1:])
    # every prompt drawn was sampled once, and the loader moved past exactly those
    assert sum(count for count, _ in calls) == metrics["sampling/groups_sampled"] == loaders[0].state_dict()["offset"]
    assert 1 <= metrics["sampling/dropped_identical_reward"] <= metrics["sampling/groups_sampled"] - 4


def test_refills_stop_at_max_refill_rounds_and_the_step_trains_on_what_it_has(engine_server, tiny_model, capsys):
    made, _, calls = collector(engine_server, tiny_model, "grpo.filters.identical_reward=true",
                               "grpo.sampler.dynamic_sampling=true", "grpo.sampler.max_refill_rounds=0")
    groups, metrics = made.collect(seed=3)
    assert len(calls) == 1 and metrics["sampling/refills"] == 0
    assert len(groups) == metrics["sampling/groups_kept"] <= 4
    said = "(grpo.sampler.max_refill_rounds); training on those" in capsys.readouterr().err
    assert said == (len(groups) < 4)


def test_oversampled_groups_beyond_the_step_are_discarded(engine_server, tiny_model):
    made, loaders, calls = collector(engine_server, tiny_model, "grpo.sampler.num_oversample=3")
    groups, metrics = made.collect(seed=1)
    assert calls == [(7, 4)] and len(groups) == 4 and metrics["sampling/groups_sampled"] == 7
    assert [str(g.prompt.input) for g in groups] == first_prompts(tiny_model, 4)


def test_the_same_seed_and_loader_state_sample_the_same_groups(engine_server, tiny_model):
    a, _, _ = collector(engine_server, tiny_model, "grpo.sampler.dynamic_sampling=true",
                        "grpo.filters.identical_reward=true")
    b, _, _ = collector(engine_server, tiny_model, "grpo.sampler.dynamic_sampling=true",
                        "grpo.filters.identical_reward=true")
    ga, _ = a.collect(seed=5)
    gb, _ = b.collect(seed=5)
    assert [t.sample.token_ids for g in ga for t in g.trajectories] == \
        [t.sample.token_ids for g in gb for t in g.trajectories]


def test_env_num_workers_scorings_run_at_once(engine_server, tiny_model):
    made, _, _ = collector(engine_server, tiny_model, "env.num_workers=3", "grpo.filters.status=false",
                           env=lambda config: SlowMath(config, seconds=0.2))
    groups, _ = made.collect(seed=1)
    assert made.env.most == 3 and all(t.status == "ok" for g in groups for t in g.trajectories)


def test_a_scorer_past_env_task_timeout_s_fails_its_trajectories_and_the_step_goes_on(engine_server, tiny_model):
    first = first_prompts(tiny_model, 1)[0]
    # 8 workers: the 4 hung scorings keep theirs, the other prompts' are scored beside them
    made, _, _ = collector(engine_server, tiny_model, "env.task_timeout_s=0.5", "env.num_workers=8",
                           "grpo.retry_limit=1", "grpo.filters.status=false",
                           env=lambda config: SlowMath(config, 0.0, first, hang=30))
    started = time.monotonic()
    groups, metrics = made.collect(seed=1)
    assert time.monotonic() - started < 10
    hung = [t for g in groups if str(g.prompt.input) == first for t in g.trajectories]
    assert len(hung) == 4 and all(t.status == "failed" and t.reward == 0.0 for t in hung)
    assert "was scoring for longer than env.task_timeout_s (0.5 s)" in hung[0].error
    assert all(t.status == "ok" for g in groups if str(g.prompt.input) != first for t in g.trajectories)
