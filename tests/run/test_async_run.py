"""The async loop (grpo.async_grpo.enabled) on grpo_tiny: `dockyard run` with 2 trainer ranks and an
embedded engine that samples ahead of training, and its options in this process (loop_run)."""

import json

import pytest

from tests.run.test_local_run import run

ASYNC = ("grpo.async_grpo.enabled=true", "grpo.async_grpo.max_staleness_steps=1", "loss_fn.is_correction.enabled=true",
         "loss_fn.is_correction.lower_bound=0.5", "loss_fn.is_correction.upper_bound=2.0")


def rows_of(workdir):
    path = workdir / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


VALIDATION = ("grpo.max_num_steps=5", "grpo.val_at_start=true", "grpo.val_period=5",
              "data.validation={name: v, shuffle: false, generator: {name: basic_arithmetic, "
              "size: 8, seed: 5, min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}")
PARTIAL = ("grpo.async_grpo.partial_rollout=true", "grpo.async_grpo.mask_offpolicy_in_partial_rollout=true",
           "grpo.async_grpo.sliding_window=windowed-fifo")


def test_async_run_trains_within_the_lag_bound_and_logs_the_pipeline(tiny_model, tmp_path):
    result = run(tmp_path, tiny_model, *ASYNC, *VALIDATION)
    assert result.returncode == 0, result.stdout
    check_pipeline(tmp_path)


def test_partial_rollouts_in_a_sliding_window_train_within_the_lag_bound(loop_run, tmp_path):
    loop_run(tmp_path, *ASYNC, *PARTIAL, *VALIDATION)
    check_pipeline(tmp_path)


def check_pipeline(workdir):
    rows = rows_of(workdir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    train = rows[1:]
    for r in train:
        assert len(r["async/lag"]) == 4 and max(r["async/lag"]) <= 1
        assert len(r["async/prompt_rows"]) == 4
        for key in ("async/trainer_idle_seconds", "async/generator_idle_seconds", "async/buffer_groups",
                    "async/regenerated_groups", "async/partial_resumes", "safeguard/is_weight_mean"):
            assert key in r, key
    assert train[0]["async/lag"] == [0, 0, 0, 0]            # the first step trains what the start weights sampled
    assert any(max(r["async/lag"]) == 1 for r in train)      # later ones what was sampled while the trainer trained
    rows_trained = [row for r in train for row in r["async/prompt_rows"]]
    assert len(set(rows_trained)) == len(rows_trained)       # no prompt trained twice
    assert "val/accuracy" in rows[-1]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(workdir / "runs" / "grpo_tiny" / "logs" / "tensorboard"))
    events.Reload()
    assert "async/lag" in events.Tags()["histograms"]
    assert "async/trainer_idle_seconds" in events.Tags()["scalars"]


def test_async_settings_the_seed_forbids_are_refused_before_starting(tiny_model, tmp_path):
    result = run(tmp_path, tiny_model, "grpo.async_grpo.enabled=true", "cluster.colocate=true",
                 "grpo.sampler.dynamic_sampling=true", "policy.train_global_batch_size=6")
    assert result.returncode == 2
    assert "cluster.colocate: async GRPO (grpo.async_grpo.enabled) runs rollout and training on disjoint" in result.stdout
    assert "grpo.sampler.dynamic_sampling: async GRPO (grpo.async_grpo.enabled) does not support dynamic sampling" \
        in result.stdout
    assert "loss_fn.is_correction.enabled: async GRPO" in result.stdout
    assert "Traceback" not in result.stdout and not (tmp_path / "runs").exists()


def test_a_mini_batch_that_splits_groups_is_advice_not_an_error(tiny_model):
    """docs/async.md recommends M % N == 0 with async. (Together with the per-dataset divisibility
    rule it is implied for one dataset; the advice speaks for configs that reach it otherwise.)"""
    from dockyard.config import constraints, load_config

    loaded = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", *ASYNC])
    assert loaded.advice == []
    cfg = loaded.config
    cfg.grpo.num_generations_per_prompt = 3
    (advice,) = constraints.advise(cfg)
    assert advice.path == "policy.train_global_batch_size" and "not a multiple of grpo.num_generations_per_prompt (3)" \
        in advice.message


def test_the_async_loop_checks_the_async_rules_again_when_it_starts(tiny_model):
    """A resolved config edited after validation (or written by hand) still meets the rules: the loop
    refuses it before building anything."""
    from dockyard.config import load_config
    from dockyard.config.errors import ConfigError
    from dockyard.loop.async_grpo import AsyncGRPOTrainer

    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", *ASYNC]).config
    cfg.loss_fn.is_correction.enabled = False
    cfg.grpo.sampler.num_oversample = 2
    with pytest.raises(ConfigError) as err:
        AsyncGRPOTrainer(cfg, world=None, device=None, replicas=[], weight_sync_port=0)
    assert "loss_fn.is_correction.enabled: async GRPO" in str(err.value)
    assert "grpo.sampler.num_oversample: async GRPO" in str(err.value)
