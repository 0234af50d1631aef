"""grpo_tiny end to end (one trainer rank in this process + an engine server, tests/run/in_process.py)
with each policy loss, off-policy safeguard, reward transform and sampling option switched on: the
option reaches the trainer and the run completes; the options whose only trace is the loss are
compared with the same run without them (test_the_option_changes_what_is_computed)."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.run.test_local_run import run

OPTIONS = {
    "clipped_pg dual clip + clip-higher": ["loss_fn.ratio_clip_c=3.0", "loss_fn.ratio_clip_max=0.28"],
    "gspo": ["loss_fn.name=gspo", "loss_fn.ratio_clip_min=0.0003", "loss_fn.ratio_clip_max=0.0004",
             "loss_fn.loss_agg_mode=seq-mean-token-mean"],
    "reference KL k3 unbiased, moving": ["loss_fn.reference_policy_kl_penalty=0.05",
                                        "loss_fn.use_unbiased_kl=true", "loss_fn.reference_model.update_interval=1",
                                        "loss_fn.reference_model.hf_path=${policy.model_name}"],
    "IS token clip": ["loss_fn.is_correction.enabled=true", "loss_fn.is_correction.lower_bound=0.5",
                      "loss_fn.is_correction.upper_bound=2.0"],
    "IS sequence mask": ["loss_fn.is_correction.enabled=true", "loss_fn.is_correction.level=sequence",
                         "loss_fn.is_correction.action=mask", "loss_fn.is_correction.lower_bound=0.5",
                         "loss_fn.is_correction.upper_bound=2.0"],
    "IS geometric clip": ["loss_fn.is_correction.enabled=true", "loss_fn.is_correction.level=geometric",
                          "loss_fn.is_correction.lower_bound=0.9999", "loss_fn.is_correction.upper_bound=1.0001"],
    "M2PO": ["loss_fn.m2po.enabled=true", "loss_fn.m2po.threshold=0.0001"],
    "OPSM": ["loss_fn.opsm.enabled=true", "loss_fn.opsm.delta=0.0001"],
    "rollout logprobs as old": ["loss_fn.use_rollout_logprobs=true"],
    "KL in reward": ["loss_fn.reference_policy_kl_penalty=0.05", "loss_fn.kl_in_reward=true",
                     "loss_fn.reference_model.hf_path=${policy.model_name}"],
    "reward scaling, overlong shaping, invalid-action penalty": [
        "grpo.reward_scaling.enabled=true", "grpo.reward_scaling.target_min=-1", "grpo.reward_shaping.enabled=true",
        "grpo.reward_shaping.overlong_buffer_length=8", "grpo.invalid_action_penalty=-0.5"],
    "dynamic sampling with oversampling, identical-reward filter, 2 optimizer steps": [
        "grpo.sampler.dynamic_sampling=true", "grpo.sampler.num_oversample=2", "grpo.filters.identical_reward=true",
        "policy.train_global_batch_size=8", "policy.train_micro_batch_size=2",
        # the tiny random model almost never answers right (~1% informative groups); a reward that is 1 for
        # about a quarter of the completions leaves about a third of the groups all-equal
        "imports=[user_rewards]", "env.reward={name:coin_reward}"],
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_grpo_tiny_runs_with(name, tmp_path, loop_run):
    (tmp_path / "user_rewards.py").write_text(USER_REWARDS)
    lines = loop_run(tmp_path, "grpo.max_num_steps=2", "checkpointing.enabled=false", *OPTIONS[name]).metrics()
    assert [m["step"] for m in lines] == [1, 2]
    assert all(isinstance(m["train/loss"], float) for m in lines)
    if any(key.startswith(("loss_fn.is_correction", "loss_fn.m2po", "loss_fn.opsm")) for key in OPTIONS[name]):
        assert all("safeguard/dropped_token_fraction" in m for m in lines)
    if name.startswith("IS"):
        assert all(m["safeguard/is_weight_mean"] > 0 for m in lines)
    if name.startswith("reference KL"):
        assert all("train/kl_ref" in m for m in lines)
    if name == "KL in reward":
        assert all("reward/kl_in_reward_mean" in m and "train/kl_ref" not in m for m in lines)
        assert lines[1]["reward/kl_in_reward_mean"] > 0   # the policy moved away from the reference
    if name.startswith("reward scaling"):
        # raw rewards in [0, 1] map to [-1, 1]; the penalties only lower them
        assert all(m["reward/mean"] <= 2 * m["reward/raw_mean"] - 1 + 1e-6 for m in lines)
        assert all(m["reward/mean"] < 2 * m["reward/raw_mean"] - 1 for m in lines if m["gen/truncated_fraction"] > 0)
    if name.startswith("dynamic sampling"):
        assert all(m["sampling/groups_kept"] == 4 and m["train/kept_fraction"] == 1.0 for m in lines)
        assert all(m["sampling/groups_sampled"] >= 6 for m in lines)
        assert sum(m["sampling/dropped_identical_reward"] for m in lines) > 0


# Runs on CPU are deterministic (the same run repeats its losses to the bit), so an option the loop
# ignored would give its baseline's losses. A reward the tiny model earns about a quarter of the time
# gives non-zero advantages, and two passes over each batch move the ratio off 1 so that clipping can act.
COMPARED = ["grpo.max_num_steps=2", "checkpointing.enabled=false", "loss_fn.ppo_epochs=2", "imports=[user_rewards]",
            "env.reward={name:coin_reward}"]
# option: (the baseline's overrides, the option's own)
CHANGES = {
    "dual clip": (["loss_fn.ratio_clip_min=0.99", "loss_fn.ratio_clip_max=10"], ["loss_fn.ratio_clip_c=1.0001"]),
    "clip-higher": (["loss_fn.ratio_clip_max=0.2"], ["loss_fn.ratio_clip_max=0.28"]),   # 0.28 is the default
    "gspo": (["loss_fn.ratio_clip_min=0.0003", "loss_fn.ratio_clip_max=0.0004", "loss_fn.loss_agg_mode=seq-mean-token-mean"],
             ["loss_fn.name=gspo"]),
}
_losses: dict[tuple[str, ...], list[float]] = {}


def _step_losses(loop_run, folder, overrides: list[str]) -> list[float]:
    key = tuple(overrides)
    if key not in _losses:
        workdir = folder / f"run{len(_losses)}"
        workdir.mkdir()
        (workdir / "user_rewards.py").write_text(USER_REWARDS)
        _losses[key] = [m["train/loss"] for m in loop_run(workdir, *COMPARED, *overrides).metrics()]
    return _losses[key]


@pytest.mark.parametrize("name", list(CHANGES))
def test_the_option_changes_what_is_computed(name, loop_run, tmp_path_factory):
    base, option = CHANGES[name]
    folder = tmp_path_factory.mktemp("compared")
    baseline = _step_losses(loop_run, folder, base)
    assert _step_losses(loop_run, folder, base) == baseline   # repeatable: the comparison below means something
    changed = _step_losses(loop_run, folder, base + option)
    assert all(a != b for a, b in zip(baseline, changed)), (name, baseline, changed)


def test_rollout_logprobs_as_old_are_the_samplers_not_the_trainers(tmp_path, loop_run):
    """One pass over the batch: the trainer's own logprobs as old give a ratio of exactly 1 (the forward's
    detached values); the sampler's, computed by the engine in another batch layout, differ from them."""
    def kl_old(*overrides):
        workdir = tmp_path / f"run{len(overrides)}"
        workdir.mkdir()
        (workdir / "user_rewards.py").write_text(USER_REWARDS)
        return [m["train/approx_kl_old"] for m in loop_run(workdir, *COMPARED, "loss_fn.ppo_epochs=1", *overrides).metrics()]

    assert kl_old() == [0.0, 0.0]
    assert all(value != 0.0 for value in kl_old("loss_fn.use_rollout_logprobs=true"))


USER_REWARDS = """
import zlib

from dockyard.components.rewards import MathAnswer
from dockyard.registry import register


@register("reward", "coin_reward")
class CoinReward:
    \"\"\"1 for about a quarter of the completions (by a stable hash of the text), else 0.\"\"\"

    def __call__(self, completion, label):
        return float(zlib.crc32(completion.encode()) % 4 == 0)


@register("reward", "flaky_math_answer")
class FlakyMathAnswer(MathAnswer):
    \"\"\"math_answer whose scorer crashes on every completion of a length divisible by 3.\"\"\"

    def __call__(self, completion, label):
        if len(completion) % 3 == 0:
            raise RuntimeError("scorer crashed")
        return super().__call__(completion, label)
"""


def test_a_user_reward_from_imports_that_crashes_is_retried_and_filtered(tmp_path, loop_run):
    (tmp_path / "user_rewards.py").write_text(USER_REWARDS)
    result = loop_run(tmp_path, "grpo.max_num_steps=2", "checkpointing.enabled=false", "grpo.retry_limit=2",
                      "imports=[user_rewards]", "env.reward={name:flaky_math_answer}")
    lines = result.metrics()
    assert sum(m["sampling/retried_trajectories"] for m in lines) > 0
    assert all(m["sampling/dropped_status"] == m["sampling/groups_sampled"] - m["sampling/groups_kept"] for m in lines)
    if any(m["sampling/failed_trajectories"] for m in lines):
        assert "FAILED after 2 attempt(s)" in result.output


def test_the_reference_can_come_from_a_saved_checkpoint(tmp_path, loop_run):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "user_rewards.py").write_text(USER_REWARDS)
    # a reward the tiny model earns sometimes, so the saved policy differs from the initial one
    loop_run(tmp_path / "a", "grpo.max_num_steps=2", "imports=[user_rewards]", "env.reward={name:coin_reward}")
    saved = tmp_path / "a" / "runs" / "grpo_tiny" / "checkpoints" / "step_2"
    [line] = loop_run(tmp_path / "b", "grpo.max_num_steps=1", "checkpointing.enabled=false",
                      "loss_fn.reference_policy_kl_penalty=0.05", f"loss_fn.reference_model.checkpoint_path={saved}",
                      "loss_fn.reference_model.hf_path=${policy.model_name}").metrics()
    # at step 1 the policy is the initial model: a KL above zero means the reference holds the trained weights
    assert line["train/kl_ref"] > 1e-6


def test_a_checkpoint_of_another_model_as_reference_ends_the_run_naming_the_field(tmp_path, tiny_model):
    other = tmp_path / "other" / "step_1"
    dcp.save({"model": {"lm_head.weight": torch.zeros(2, 2)}}, checkpoint_id=str(other / "dcp"), no_dist=True)
    (other / "trainer_state.json").write_text("{}")
    result = run(tmp_path, tiny_model, "grpo.max_num_steps=1", "loss_fn.reference_policy_kl_penalty=0.05",
                 f"loss_fn.reference_model.checkpoint_path={other}",
                 "loss_fn.reference_model.hf_path=${policy.model_name}")
    assert result.returncode != 0
    assert "loss_fn.reference_model.checkpoint_path: " in result.stdout
    assert "does not hold this model's weights" in result.stdout and "Traceback" not in result.stdout
    assert not (tmp_path / "runs" / "grpo_tiny" / "checkpoints").exists()
