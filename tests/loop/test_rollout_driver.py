"""The async rollout driver against a real engine server and the tiny model: weights versions on
every token, the lag bound, partial rollouts that keep their tokens and logprobs across a refit,
and the replay set a checkpoint keeps."""

import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dockyard.config import load_config
from dockyard.data.datasets import PromptLoader, build_messages, load_prompts, prompt_token_ids
from dockyard.envs.math import MathEnvironment
from dockyard.generation.client import EngineClient
from dockyard.generation.engine import SamplingParams
from dockyard.loop.rollout_driver import RolloutDriver
from dockyard.loop.rollouts import RolloutCollector
from dockyard.models import load_causal_lm, load_tokenizer

ASYNC = ["grpo.async_grpo.enabled=true", "loss_fn.is_correction.enabled=true",
         "loss_fn.is_correction.lower_bound=0.5", "loss_fn.is_correction.upper_bound=2.0"]


def version_weights(tiny_model: Path, version: int) -> dict[str, torch.Tensor]:
    """The tiny model's weights with the final norm scaled per version: every version samples with
    its own distribution, so a token's logprob tells which version sampled it."""
    weights = load_file(str(tiny_model / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * (1.0 + 0.5 * version)
    return weights


class Pusher:
    """The refit: the version's weights to disk, then the engine's /update_weights_from_disk."""

    def __init__(self, client: EngineClient, folder: Path):
        self.client, self.folder, self.pushes = client, folder, 0

    def __call__(self, weights: dict) -> None:
        target = self.folder / f"push_{self.pushes}"
        target.mkdir(parents=True)
        save_file(weights, str(target / "model.safetensors"))
        self.client.load_weights_from_disk(target)
        self.pushes += 1


def make_driver(engine_server, tiny_model, tmp_path, *overrides, max_tokens=8, replay=None, version=0):
    url, _ = engine_server
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", *ASYNC, *overrides]).config
    tokenizer = load_tokenizer(tiny_model)
    dataset = cfg.data.datasets[0]
    loader = PromptLoader(load_prompts(dataset), dataset.shuffle, cfg.policy.seed)
    env = MathEnvironment(cfg.env)
    client = EngineClient(url)
    sampling = lambda lengths, n, seed, t=None: SamplingParams(   # noqa: E731
        n=n, max_tokens=max_tokens, temperature=1.0, ignore_eos=True, seed=seed)
    prompt_ids = lambda p: prompt_token_ids(tokenizer, build_messages(p, None, env.instruction))   # noqa: E731
    collector = RolloutCollector(cfg, env, [loader], generate=client.generate, prompt_ids=prompt_ids,
                                 sampling=sampling, decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    pusher = Pusher(client, tmp_path)
    pusher(version_weights(tiny_model, version))
    driver = RolloutDriver(cfg, client, collector, loader, pusher, version=version, replay=replay, seed=1)
    return driver, loader, cfg


def token_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize("stale, window", [(1, "no-window"), (2, "windowed-fifo"), (0, "window-gated")])
def test_every_trained_group_is_within_the_lag_bound_and_tagged_with_its_version(
        engine_server, tiny_model, tmp_path, stale, window):
    """A trainer much slower than the fleet: the driver runs ahead only as far as the bound allows."""
    driver, _, cfg = make_driver(engine_server, tiny_model, tmp_path, f"grpo.async_grpo.max_staleness_steps={stale}",
                                 f"grpo.async_grpo.sliding_window={window}")
    driver.start()
    seen_lags = []
    try:
        for step in range(1, 6):
            groups = driver.take(step - 1, timeout_s=120)
            assert len(groups) == cfg.grpo.num_prompts_per_step
            lags = driver.last_lags
            seen_lags += lags
            for group, lag in zip(groups, lags):
                for t in group.trajectories:
                    assert len(t.versions) == t.sample.response_length
                    assert set(t.versions) == {step - 1 - lag}   # no partial rollouts: one version each
            assert max(lags) <= stale
            time.sleep(0.5)                      # training takes a while; the fleet keeps sampling
            driver.commit()
            driver.publish(version_weights(tiny_model, step), step)
        figures = driver.figures()
    finally:
        driver.close()
    assert max(seen_lags) == stale        # the pipeline did run as far ahead as allowed
    assert figures["async/refits"] >= 1 and figures["async/weights_version"] >= 4


RESPONSE = 96   # tokens a sample decodes (with its prompt, within grpo_tiny's sequence length)


def test_partial_rollouts_keep_their_tokens_versions_and_logprobs_across_a_refit(engine_server, tiny_model, tmp_path):
    driver, _, _ = make_driver(engine_server, tiny_model, tmp_path, "grpo.async_grpo.max_staleness_steps=1",
                               "grpo.async_grpo.partial_rollout=true",
                               "grpo.async_grpo.mask_offpolicy_in_partial_rollout=true", max_tokens=RESPONSE)
    driver.start()
    groups, resumed = [], []
    try:
        # A refit cuts a sample only while the engine decodes it; on a busy machine one may land before
        # the first token or after the last (a CI run on a loaded machine once missed six times with
        # delays 0.1 to 0.6 s), so refit again under the next version, at delays cycling from short to
        # long, until one cuts
        for version in range(1, 13):
            deadline = time.monotonic() + 60
            while driver.inflight == 0:
                assert time.monotonic() < deadline, "no generation request started within 60 s"
                time.sleep(0.01)
            time.sleep((0.05, 0.15, 0.3, 0.6)[(version - 1) % 4])
            driver.publish(version_weights(tiny_model, version), version)
            groups += driver.take(version - 1, timeout_s=120)
            driver.commit()
            resumed = [t for g in groups for t in g.trajectories if len(set(t.versions)) > 1]
            if resumed:
                break
        figures = driver.figures()
    finally:
        driver.close()
    assert resumed, "no sample was continued across twelve refits"
    assert figures["async/partial_resumes"] >= len(resumed)
    models: dict[int, torch.nn.Module] = {}

    def model_of(version: int) -> torch.nn.Module:
        if version not in models:
            model = load_causal_lm(tiny_model, dtype=torch.float32).eval()
            model.load_state_dict(version_weights(tiny_model, version), strict=False)
            models[version] = model
        return models[version]

    for t in resumed[:3]:
        sample = t.sample
        response = sample.token_ids[sample.prompt_length:]
        assert len(response) == RESPONSE and t.versions == sorted(t.versions)   # the old tokens kept, then new ones
        ids = sample.token_ids[:sample.prompt_length]
        rollout = torch.tensor(sample.rollout_logprobs)
        # each token's logprob is the one of the weights that sampled it, not of another version
        for version in sorted(set(t.versions)):
            first, last = t.versions.index(version), len(t.versions) - t.versions[::-1].index(version)
            span = slice(first, last)
            mine = token_logprobs(model_of(version), ids, response)[span]
            other = token_logprobs(model_of(version + 1), ids, response)[span]
            torch.testing.assert_close(rollout[span], mine, atol=2e-3, rtol=0)
            # and not the next version's: those weights explain the tokens worse (a span can be a single
            # token whose logprob the two versions give within 4e-3 of each other; which tokens fall under
            # which version depends on when the refits landed)
            assert (rollout[span] - other).abs().max() > max(5 * (rollout[span] - mine).abs().max(), 1e-4)


def test_replay_set_holds_every_drawn_untrained_prompt_exactly_once(engine_server, tiny_model, tmp_path):
    """What a checkpoint keeps: rows drawn but not trained (taken, finished, running) are replayed
    after a resume, trained ones never; together they are exactly what the loader handed out."""
    driver, loader, cfg = make_driver(engine_server, tiny_model, tmp_path, "grpo.async_grpo.max_staleness_steps=1")
    batch = cfg.grpo.num_prompts_per_step
    driver.start()
    trained: list[int] = []
    try:
        for step in (1, 2):
            driver.take(step - 1, timeout_s=120)
            taken_rows = [t.row for t in driver.taken]
            state = driver.state()
            assert state["replay"][:batch] == taken_rows      # taken, not trained yet: still replayed
            driver.commit()
            trained += taken_rows
            driver.publish(version_weights(tiny_model, step), step)
        deadline = time.monotonic() + 60
        while len(driver.tickets) < batch:          # the next groups are under way when the run stops
            assert time.monotonic() < deadline
            time.sleep(0.05)
        state = driver.state()
    finally:
        driver.close()
    assert len(state["replay"]) >= batch
    drawn = PromptLoader(loader.prompts, loader.shuffle, loader.seed)
    drawn_rows = drawn.take_rows(state["loader"]["epoch"] * len(loader.prompts) + state["loader"]["offset"])
    assert not set(trained) & set(state["replay"])
    assert sorted(trained + state["replay"]) == sorted(drawn_rows)

    # a resumed driver starts the replayed rows first, under the resumed weights (windowed-fifo: the
    # first step takes the first groups started)
    resumed_loader_state = state["loader"]
    again, again_loader, _ = make_driver(engine_server, tiny_model, tmp_path / "again",
                                         "grpo.async_grpo.max_staleness_steps=1",
                                         "grpo.async_grpo.sliding_window=windowed-fifo", replay=state["replay"],
                                         version=2)
    again_loader.load_state_dict(resumed_loader_state)
    again.start()
    try:
        again.take(2, timeout_s=120)
        first_rows = [t.row for t in again.taken]
    finally:
        again.close()
    assert first_rows == state["replay"][:batch]
