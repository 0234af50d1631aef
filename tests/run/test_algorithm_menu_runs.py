"""grpo_tiny end to end (2 trainer ranks + engine) with each policy loss and each off-policy
safeguard switched on: the option reaches the trainer and the run completes."""

import json

import pytest

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
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_grpo_tiny_runs_with(name, tmp_path, tiny_model):
    result = run(tmp_path, tiny_model, "grpo.max_num_steps=2", "checkpointing.enabled=false", *OPTIONS[name])
    assert result.returncode == 0, result.stdout[-3000:]
    lines = [json.loads(line) for line in
             (tmp_path / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(isinstance(m["train/loss"], float) for m in lines)
    if any(key.startswith(("loss_fn.is_correction", "loss_fn.m2po", "loss_fn.opsm")) for key in OPTIONS[name]):
        assert all("safeguard/dropped_token_fraction" in m for m in lines)
    if name.startswith("IS"):
        assert all(m["safeguard/is_weight_mean"] > 0 for m in lines)
    if name.startswith("reference KL"):
        assert all("train/kl_ref" in m for m in lines)
