"""Every cross-field rule, triggered from a real config of the family with overrides."""

import pytest

from dockyard.config import constraints
from dockyard.config.constraints import registry
from tests.conftest import problems_of

TWO_DATASETS = ("data.datasets=[{name: a, generator: {name: basic_arithmetic}, num_prompts_per_step: 2},"
                "{name: b, generator: {name: chain_sum}, num_prompts_per_step: 1}]")

# (rule, config, overrides, expected problem text (a substring of 'path: message'))
CASES = [
    ("trainer_world_divides_model_parallel", "grpo_swe", ["policy.dtensor_cfg.tensor_parallel_size=3"],
     "policy.dtensor_cfg: trainer GPUs (16) must be divisible by TP*PP*CP (3)"),
    ("trainer_world_divides_model_parallel", "grpo_tiny", ["policy.dtensor_cfg.context_parallel_size=3"],
     "policy.dtensor_cfg: trainer ranks (2) must be divisible by TP*PP*CP (3)"),
    ("trainer_world_divides_model_parallel", "grpo_swe", ["cluster.trainer.num_nodes=null", "cluster.rollout.num_nodes=4"],
     "cluster.trainer.num_nodes: the trainer gets 0 nodes"),
    ("rollouts_divide_into_mini_batches", "grpo_tiny", ["policy.train_global_batch_size=12"],
     "policy.train_global_batch_size: grpo.num_prompts_per_step x grpo.num_generations_per_prompt (4 x 4 = 16) "
     "is not divisible by policy.train_global_batch_size (12)"),
    ("prompts_divide_over_dp_and_mini_batches", "grpo_swe",
     ["grpo.num_prompts_per_step=36", "policy.train_global_batch_size=144"],
     "data.datasets[0].num_prompts_per_step: data.datasets[0] num_prompts_per_step (36) is not divisible by "
     "(dp_size * num_mini_batch) = (8 * 2) = 16"),
    ("prompts_divide_over_dp_and_mini_batches", "grpo_tiny", [TWO_DATASETS],
     "data.datasets: the datasets' num_prompts_per_step add up to 3, but grpo.num_prompts_per_step is 4"),
    ("prompts_divide_over_dp_and_mini_batches", "grpo_tiny", [TWO_DATASETS, "data.datasets.1.num_prompts_per_step=null"],
     "data.datasets: set num_prompts_per_step on every dataset or on none"),
    ("micro_batches_fill_a_step", "grpo_tiny", ["policy.train_micro_batch_size=3"],
     "policy.train_micro_batch_size: policy.train_global_batch_size (16) must be divisible by dp_size x "
     "train_micro_batch_size (2 x 3 = 6)"),
    ("shared_prompt_rows", "grpo_tiny", ["policy.dynamic_batching.share_prompts=true"],
     "policy.dynamic_batching.share_prompts: shared-prompt rows are sized by the token budget: set "
     "policy.dynamic_batching.enabled=true"),
    ("shared_prompt_rows", "grpo_swe", ["policy.dynamic_batching.share_prompts=true", "policy.backend=jax"],
     "policy.dynamic_batching.share_prompts: shared-prompt rows are built by the dtensor and megatron backends, "
     "not jax"),
    ("megatron_parallelism", "grpo_swe", ["policy.backend=megatron"],
     "policy.megatron_cfg: policy.backend is megatron, so policy.megatron_cfg must be set"),
    ("megatron_parallelism", "grpo_swe", ["policy.backend=megatron", "policy.megatron_cfg={bf16: true, expert_model_parallel_size: 3}"],
     "policy.megatron_cfg.expert_model_parallel_size: trainer GPUs (16) must be divisible by ETP*EP*PP (3)"),
    ("megatron_parallelism", "grpo_swe",
     ["policy.backend=megatron", "policy.megatron_cfg={bf16: true, virtual_pipeline_model_parallel_size: 2}"],
     "policy.megatron_cfg.virtual_pipeline_model_parallel_size: virtual pipeline stages need pipeline_model_parallel_size > 1"),
    ("sequence_budgets", "grpo_tiny", ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.max_tokens_per_gpu=64"],
     "policy.dynamic_batching.max_tokens_per_gpu: 64 is smaller than policy.max_total_sequence_length (128)"),
    ("sequence_budgets", "grpo_tiny", ["policy.generation.max_new_tokens=128"],
     "policy.generation.max_new_tokens: 128 leaves no room for the prompt"),
    ("group_placement", "grpo_tiny", ["cluster.colocate=true", "cluster.num_nodes=1", "cluster.rollout.num_nodes=2"],
     "cluster.rollout: with cluster.colocate true, rollout ranks (2) must be <= trainer ranks (1)"),
    ("server_tasks_fit_gpus", "grpo_swe", ["cluster.rollout.tasks_per_node=16"],
     "cluster.rollout.tasks_per_node: 16 servers x 4 GPUs (cluster.rollout_gpus_per_replica) = 64 GPUs per node, "
     "but the rollout nodes have 8"),
    ("slurm_time_limit", "grpo_tiny", ["cluster.slurm.time=1-2:3:4:5"],
     "cluster.slurm.time: '1-2:3:4:5' is not a Slurm time limit"),
    ("slurm_time_limit", "grpo_tiny", ["cluster.slurm.time=00:02:00", "cluster.slurm.signal_delay_s=120"],
     "cluster.slurm.signal_delay_s: the warning signal comes 120 s before the end, but the time limit is only 2 min"),
    ("group_placement", "grpo_hle", ["cluster.teacher.num_nodes=3"],
     "cluster.teacher: with cluster.colocate true, teacher GPUs (24) must be <= trainer GPUs (16)"),
    ("group_placement", "grpo_swe", ["cluster.trainer.num_nodes=3"],
     "cluster.num_nodes: trainer + rollout + teacher nodes (3 + 2 + 0 = 5) must equal cluster.num_nodes (4)"),
    ("group_placement", "grpo_swe", ["cluster.rollout.num_nodes=0", "cluster.trainer.num_nodes=4"],
     "cluster.rollout.num_nodes: with cluster.colocate false the rollout group needs at least one node"),
    ("rollout_replicas", "grpo_swe", ["cluster.rollout_gpus_per_replica=3"],
     "cluster.rollout_gpus_per_replica: rollout GPUs (16) are not divisible by GPUs per replica (3)"),
    ("teachers_only_with_distillation", "grpo_swe", ["cluster.teacher.num_nodes=1", "cluster.num_nodes=5"],
     "cluster.teacher.num_nodes: 1 teacher nodes are requested but grpo.adv_estimator.name is not opd"),
    ("teachers_only_with_distillation", "v4_consolidation", ["grpo.adv_estimator.name=grpo", "cluster.teacher.num_nodes=0",
                                                             "cluster.num_nodes=5"],
     "on_policy_distillation: teachers are configured but grpo.adv_estimator.name is 'grpo'"),
    ("distillation", "grpo_tiny", ["grpo.adv_estimator.name=opd"],
     "on_policy_distillation: grpo.adv_estimator.name is opd, so on_policy_distillation (its teachers) must be set"),
    ("distillation", "v4_consolidation", ["grpo.async_grpo.enabled=false"],
     "grpo.async_grpo.enabled: OPD collects teacher scores on the async path; it must be true"),
    ("distillation", "v4_consolidation", ["+data_plane={address: 'plane:5555'}"],
     "data_plane: OPD does not run over a data plane"),
    ("job_container", "grpo_tiny", ["cluster.container.runtime=apptainer"],
     "cluster.container.image: cluster.container: runtime apptainer needs an image"),
    ("job_container", "grpo_tiny", ["cluster.container.runtime=slurm_oci", "cluster.container.image=/i",
                                    "cluster.rollout.tasks_per_node=2"],
     "cluster.rollout.tasks_per_node: cluster.container: Slurm's OCI mode runs one task per node in a step, and "
     "the rollout component has 2 per node"),
    ("job_container", "grpo_tiny", ["cluster.container.runtime=pyxis", "cluster.container.image=/images/d.sqsh",
                                    "cluster.container.mounts=[data:/data]"],
     "cluster.container.mounts: cluster.container: 'data:/data' is not SRC:DST or SRC:DST:ro with absolute paths"),
    ("job_container", "grpo_tiny", ["cluster.container.runtime=charliecloud", "cluster.container.image=/images/d",
                                    "cluster.container.mounts=[/data:/data/../../etc]"],
     "cluster.container.mounts: cluster.container: '/data:/data/../../etc' is not SRC:DST or SRC:DST:ro with absolute "
     "paths (no '..' in DST)"),
    ("job_container", "grpo_tiny", ["cluster.container.runtime=podman", "cluster.container.image=localhost/d:1",
                                    "cluster.container.rollout.runtime=none"],
     "cluster.container.rollout.runtime: cluster.container: the trainer runs in a container and starts the rollout "
     "servers from there, so they must run in one too"),
    ("sandboxes_in_a_job_container", "grpo_terminal_bench_local", ["cluster.container.runtime=slurm_oci",
                                                                  "cluster.container.image=/images/latest"],
     "env.sandbox.type: cluster.container: the bubblewrap sandboxes are made by trainer rank 0, inside the "
     "trainer's slurm_oci container"),
    ("data_plane", "grpo_tiny_plane", ["data_plane.address=plane:6379"],
     "data_plane.address: data_plane: address and start: true exclude each other"),
    ("data_plane", "grpo_tiny_plane", ["data_plane.start=false"],
     "data_plane.address: data_plane: give the address of a running Redis / Valkey server, or start: true"),
    ("data_plane", "grpo_tiny_plane", ["grpo.async_grpo.enabled=false"],
     "grpo.async_grpo.enabled: data_plane: workers sample with the weights they last loaded"),
    ("data_plane", "grpo_tiny_plane", ["grpo.async_grpo.partial_rollout=true"],
     "grpo.async_grpo.partial_rollout: data_plane: a worker finishes each request"),
    ("data_plane", "grpo_tiny_plane", ["grpo.async_grpo.sliding_window=windowed-fifo"],
     "grpo.async_grpo.sliding_window: data_plane: groups train in the order workers deliver them"),
    ("data_plane", "grpo_tiny_plane", ["data_plane.start=false", "data_plane.address=plane:6379",
                                       "data_plane.port=7000"],
     "data_plane.port: data_plane: the port of the broker `start` runs"),
    ("data_plane", "grpo_tiny_plane", ["cluster.rollout.num_nodes=2"],
     "cluster.rollout.num_nodes: data_plane: a rollout-worker job is one node"),
    ("data_plane", "grpo_tiny_plane", ["grpo.val_period=2"],
     "grpo.val_period: data_plane: validation generates on the trainer's own servers"),
    ("group_placement", "grpo_tiny_plane", ["cluster.num_nodes=3"],
     "cluster.num_nodes: trainer + rollout + teacher nodes (2 + 0 + 0 = 2) must equal cluster.num_nodes (3); "
     "with data_plane the rollout nodes are the worker jobs'"),
    ("distillation", "v4_consolidation", ["grpo.skip_prev_logprobs=true"],
     "grpo.skip_prev_logprobs: the OPD advantage subtracts prev_logprobs"),
    ("distillation", "v4_consolidation", ["on_policy_distillation.pg_ratio=0"],
     "on_policy_distillation.pg_ratio: at least one of pg_ratio / gkd_ratio must be > 0"),
    ("distillation", "v4_consolidation", ["on_policy_distillation.gkd_ratio=1"],
     "on_policy_distillation.gkd_ratio: gkd_ratio 1 leaves no policy-gradient branch"),
    ("distillation", "v4_consolidation", ["on_policy_distillation.teacher_model_by_agent_name.swe_agent=coder"],
     "on_policy_distillation.teacher_model_by_agent_name.swe_agent: 'coder' is not a teacher"),
    ("distillation", "v4_consolidation", ["on_policy_distillation.default_teacher=nobody"],
     "on_policy_distillation.default_teacher: 'nobody' is not a teacher"),
    ("distillation", "v4_consolidation", ["data.datasets.0.teacher_name=chemist"],
     "data.datasets[0].teacher_name: 'chemist' is not a teacher"),
    ("distillation", "v4_consolidation", ["on_policy_distillation.teachers.1.name=code"],
     "on_policy_distillation.teachers: teacher name 'code' is used twice"),
    ("distillation", "v4_consolidation", ["cluster.teacher.num_nodes=0", "cluster.num_nodes=5"],
     "cluster.teacher: OPD needs teacher devices"),
    ("distillation", "v4_consolidation", ["on_policy_distillation.parallelism.tensor_parallel_size=5"],
     "on_policy_distillation.parallelism: teacher GPUs (24) must be divisible by teacher TP*PP*CP (5)"),
    ("distillation", "v4_consolidation", ["cluster.teacher.num_nodes=2", "cluster.num_nodes=7",
                                          "on_policy_distillation.parallelism.tensor_parallel_size=4"],
     "on_policy_distillation.teachers: teacher_dp (4) and the number of teachers (3) must divide one another"),
    ("distillation", "v4_consolidation", ["cluster.teacher.num_nodes=2", "cluster.num_nodes=7",
                                          "on_policy_distillation.parallelism.tensor_parallel_size=4"],
     "on_policy_distillation.parallelism: teacher_dp (4) and trainer dp_size (6) must divide one another"),
    ("async_grpo", "grpo_terminal_bench", ["cluster.colocate=true"], "cluster.colocate: async GRPO"),
    ("async_grpo", "grpo_terminal_bench", ["grpo.run_mode=train_only"],
     "grpo.run_mode: async GRPO (grpo.async_grpo.enabled) only supports run_mode default"),
    ("async_grpo", "grpo_terminal_bench", ["grpo.sampler.num_oversample=4"], "grpo.sampler.num_oversample: async GRPO"),
    ("async_grpo", "grpo_terminal_bench", ["grpo.sampler.dynamic_sampling=true"],
     "grpo.sampler.dynamic_sampling: async GRPO (grpo.async_grpo.enabled) does not support dynamic sampling"),
    ("async_grpo", "grpo_terminal_bench", ["grpo.reward_scaling.enabled=true"],
     "grpo.reward_scaling.enabled: async GRPO (grpo.async_grpo.enabled) does not support reward scaling"),
    ("async_grpo", "grpo_terminal_bench", ["grpo.reward_shaping.enabled=true"],
     "grpo.reward_shaping.enabled: async GRPO (grpo.async_grpo.enabled) does not support reward shaping"),
    ("async_grpo", "grpo_terminal_bench",
     ["data.datasets=[{name: a, path: a.jsonl, label_key: null}, {name: b, path: b.jsonl, label_key: null}]"],
     "data.datasets: async GRPO (grpo.async_grpo.enabled) supports one dataset (one dataloader), got 2"),
    ("async_grpo", "grpo_terminal_bench", ["loss_fn.is_correction.enabled=false"],
     "loss_fn.is_correction.enabled: async GRPO (grpo.async_grpo.enabled) samples with stale weights"),
    ("partial_rollout", "grpo_terminal_bench", ["grpo.async_grpo.partial_rollout=false"],
     "grpo.async_grpo.mask_offpolicy_in_partial_rollout: only meaningful with grpo.async_grpo.partial_rollout true"),
    ("rollout_logprobs_exclusive", "grpo_terminal_bench", ["loss_fn.use_rollout_logprobs=true"],
     "loss_fn.is_correction.enabled: cannot be combined with loss_fn.use_rollout_logprobs"),
    ("rollout_logprobs_exclusive", "grpo_tiny", ["loss_fn.use_rollout_logprobs=true", "loss_fn.m2po.enabled=true"],
     "loss_fn.m2po.enabled: cannot be combined with loss_fn.use_rollout_logprobs"),
    ("is_correction_bounds", "grpo_tiny", ["loss_fn.is_correction.enabled=true"],
     "loss_fn.is_correction.lower_bound: required when is_correction is enabled"),
    ("is_correction_bounds", "grpo_tiny", ["loss_fn.is_correction.enabled=true"],
     "loss_fn.is_correction.upper_bound: required when is_correction is enabled"),
    ("is_correction_bounds", "grpo_tiny", ["loss_fn.is_correction.enabled=true", "loss_fn.is_correction.lower_bound=1.5",
                                           "loss_fn.is_correction.upper_bound=2"],
     "loss_fn.is_correction: bounds [1.5, 2.0] must satisfy lower_bound <= 1 <= upper_bound"),
    ("reference_model", "grpo_tiny", ["loss_fn.reference_policy_kl_penalty=0.1"],
     "loss_fn.reference_model: loss_fn.reference_policy_kl_penalty > 0 needs a reference"),
    ("reference_model", "grpo_tiny", ["loss_fn.reference_model.update_interval=5"],
     "loss_fn.reference_model.update_interval: a moving reference needs loss_fn.reference_policy_kl_penalty > 0"),
    ("reference_model", "grpo_tiny", ["loss_fn.kl_in_reward=true"], "loss_fn.kl_in_reward: needs"),
    ("reference_model", "grpo_tiny", ["loss_fn.use_unbiased_kl=true"], "loss_fn.use_unbiased_kl: weights the "
     "reference KL, which is off"),
    ("reference_model", "grpo_tiny", ["loss_fn.use_unbiased_kl=true", "loss_fn.kl_in_reward=true",
                                      "loss_fn.reference_policy_kl_penalty=0.1",
                                      "loss_fn.reference_model.hf_path=${policy.model_name}"],
     "with loss_fn.kl_in_reward the KL goes into the reward"),
    ("reference_model", "grpo_tiny", ["loss_fn.name=gspo", "loss_fn.ratio_clip_c=3"],
     "loss_fn.ratio_clip_c: dual clip applies to loss clipped_pg only, not 'gspo'"),
    ("precision", "grpo_swe", ["policy.backend=megatron", "policy.megatron_cfg={bf16: true, fp16: true}"],
     "policy.megatron_cfg: bf16 and fp16 are mutually exclusive; pick one"),
    ("precision", "grpo_swe", ["policy.backend=megatron", "policy.megatron_cfg={fp16: true}"],
     "policy.megatron_cfg: megatron trains in fp16 (bf16=False, fp16=True) but policy.precision is 'bf16'"),
    ("precision", "grpo_swe", ["policy.backend=megatron", "policy.precision=fp32", "policy.megatron_cfg={fp8: hybrid}"],
     "policy.megatron_cfg.fp8: FP8 needs bf16 or fp16 as the primary precision"),
    ("precision", "grpo_swe", ["policy.backend=megatron", "policy.megatron_cfg={bf16: true, fp8_param: true}"],
     "policy.megatron_cfg.fp8_param: fp8_param needs an fp8 recipe"),
    ("precision", "grpo_tiny", ["generation=vllm", "policy.generation.vllm_cfg.precision=fp8"],
     "policy.generation.vllm_cfg.precision: fp8 serving needs GPUs"),
    ("precision", "grpo_tiny", ["generation=vllm", "policy.generation.vllm_cfg.precision=fp8"],
     "policy.generation.vllm_cfg.precision: fp8 serving quantises bf16/fp16 training weights; policy.precision is fp32"),
    ("multimodal_inputs", "grpo_osworld", ["generation=sglang"],
     "policy.generation.allow_multimodal_inputs: the sglang backend does not forward images yet"),
    ("multimodal_inputs", "grpo_osworld", ["generation=embedded"],
     "policy.generation.allow_multimodal_inputs: the embedded engine serves text-only models"),
    ("screenshots_need_image_inputs", "grpo_osworld_local", ["env.observation_type=screenshot"],
     "env.observation_type: screenshot shows the model screenshots: set policy.generation.allow_multimodal_inputs=true"),
    ("screenshots_need_image_inputs", "grpo_osworld_screenshot_local", ["policy.generation.max_images_per_sample=2"],
     "policy.generation.max_images_per_sample: 2, but an episode of grpo.max_rollout_turns (3) turns carries up to 3"),
    ("multi_turn_needs_agent", "grpo_tiny", ["grpo.max_rollout_turns=3"],
     "env.agent: grpo.max_rollout_turns is 3; multi-turn rollouts need an agent"),
    ("reward_scaling_range", "grpo_tiny", ["grpo.reward_scaling.enabled=true", "grpo.reward_scaling.source_max=0"],
     "grpo.reward_scaling.source_max: 0.0 must be > source_min (0.0)"),
    ("saving", "grpo_tiny", ["checkpointing.save_state=false"],
     "checkpointing.save_state: checkpointing is enabled but save_state and export_hf are both false"),
    ("validation_is_not_drawn_from", "grpo_math_smol", ["data.validation.weight=2"],
     "data.validation.weight: validation is not mixed with other datasets"),
    ("validation_is_not_drawn_from", "grpo_math_smol", ["data.validation.shuffle=true"],
     "data.validation.shuffle: validation is read in order"),
    ("saving", "grpo_tiny", ["checkpointing.keep_top_k=2"],
     "checkpointing.metric_name: keep_top_k ranks checkpoints by a metric; set metric_name"),
    ("evaluation", "grpo_tiny", ["grpo.val_period=5"], "grpo.val_period: validation every 5 steps needs data.validation"),
    ("evaluation", "grpo_tiny", ["grpo.val_at_start=true"], "grpo.val_at_start: validation at start needs data.validation"),
    ("evaluation", "sft", ["data.validation=null"], "sft.val_period: validation every 200 steps needs data.validation"),
    ("tracking", "grpo_tiny", ["logger.mlflow_enabled=true"],
     "logger.mlflow.tracking_uri: required when logger.mlflow_enabled is true"),
    ("adam_settings_need_adam", "grpo_tiny", ["policy.optimizer.name=sgd", "policy.optimizer.betas=[0.8,0.9]"],
     "policy.optimizer.betas: an AdamW setting; policy.optimizer.name is sgd, which has none"),
]


@pytest.mark.parametrize("rule,config,overrides,expected", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_reports_its_violation(rule, config, overrides, expected, monkeypatch):
    """The named rule alone is run (the others are taken out): the problem is proved to be its own."""
    (only,) = [each for each in constraints.RULES if each.__name__ == rule]
    monkeypatch.setattr(registry, "RULES", [only])
    problems = problems_of(f"{config}.yaml", *overrides)
    assert any(expected in p for p in problems), f"expected {expected!r} from {rule} in {problems}"


@pytest.mark.parametrize("config", sorted({c[1] for c in CASES}))
def test_base_configs_of_the_cases_are_valid(config):
    assert problems_of(f"{config}.yaml") == []


def test_every_rule_has_a_case():
    covered = {case[0] for case in CASES}
    assert {rule.__name__ for rule in constraints.RULES} == covered


def test_all_violations_are_reported_together():
    problems = problems_of("grpo_terminal_bench.yaml", "grpo.sampler.dynamic_sampling=true",
                           "grpo.reward_shaping.enabled=true", "loss_fn.is_correction.enabled=false",
                           "logger.mlflow_enabled=true")
    assert len(problems) == 4, problems


def test_the_v4_recipe_meets_the_distillation_rules():
    from dockyard.config import load_config

    cfg = load_config("v4_consolidation.yaml").config
    assert cfg.grpo.adv_estimator.name == "opd"
    assert cfg.grpo.async_grpo.enabled
    assert cfg.data_plane is None
    assert not cfg.grpo.skip_prev_logprobs
