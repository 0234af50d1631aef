"""docs/config-reference.md is generated from the schema; this fails when they drift apart."""

from dockyard.config.reference import field_paths, render
from tests.conftest import REPO

DOC = REPO / "docs" / "config-reference.md"


def test_reference_matches_the_schema():
    assert DOC.read_text() == render(), "run `python tools/gen_config_reference.py` and commit the result"


def test_every_field_is_documented_with_the_seed_000_names():
    text = DOC.read_text()
    for path in field_paths():
        assert f"| `{path}` |" in text
    for name in ("policy.model_name", "policy.max_total_sequence_length", "policy.train_global_batch_size",
                 "policy.train_micro_batch_size", "policy.generation.temperature", "policy.generation.top_p",
                 "policy.generation.ignore_eos", "policy.generation.allow_multimodal_inputs",
                 "policy.generation.max_image_pixels", "policy.generation.max_images_per_sample",
                 "policy.generation.vllm_cfg.precision", "policy.generation.vllm_cfg.env_vars",
                 "grpo.num_prompts_per_step", "grpo.num_generations_per_prompt", "grpo.adv_estimator.name",
                 "grpo.async_grpo.enabled", "loss_fn.reference_policy_kl_penalty",
                 "on_policy_distillation.teacher_model_by_agent_name", "cluster.gpus_per_node",
                 "cluster.num_nodes", "grpo.max_num_steps", "checkpointing.enabled",
                 "checkpointing.checkpoint_dir", "checkpointing.save_period", "checkpointing.keep_top_k",
                 "checkpointing.metric_name", "logger.log_dir"):
        assert name in field_paths(), name
