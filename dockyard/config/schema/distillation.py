"""`on_policy_distillation`: teachers that score student rollouts (stage 3 of a V4-style recipe)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import PositiveInt

from dockyard.config.fields import Section, field


class TeacherConfig(Section):
    name: str = field(..., "Teacher id, referenced by teacher_model_by_agent_name and data.datasets[].teacher_name.")
    hf_path: str = field(..., "HF folder of the teacher (supplies the model structure).")
    checkpoint_path: Optional[str] = field(None, "Load weights from this dockyard checkpoint instead of hf_path.",
                                           "An unusable path fails the run at start-up; no fallback.")


class TeacherParallelism(Section):
    tensor_parallel_size: PositiveInt = field(1, "Teacher TP.")
    pipeline_parallel_size: PositiveInt = field(1, "Teacher PP.")
    context_parallel_size: PositiveInt = field(1, "Teacher CP.")


class OnPolicyDistillationConfig(Section):
    teachers: list[TeacherConfig] = field(..., "Teacher models.", "At least one.", min_length=1)
    teacher_model_by_agent_name: dict[str, str] = field(
        {}, "Which teacher scores a rollout, by the rollout's agent name (per-context teacher selection).",
        "Every value must name a teacher.")
    default_teacher: Optional[str] = field(
        None, "Teacher for a rollout whose agent name (row metadata.agent_name, else env.agent) is not in the "
        "map and whose dataset names no teacher_name.",
        "null: such a rollout is an error naming its agent (checked before the run starts); a rollout with no "
        "agent name at all goes to the first teacher.")
    pg_ratio: float = field(1.0, "Weight of the per-token KL advantage in the policy-gradient branch.", ge=0,
                            )
    gkd_ratio: float = field(0.0, "Weight of the GKD branch: L = (1-gkd) x PG + gkd x L_GKD.",
                             "At least one of pg_ratio / gkd_ratio > 0; pg_ratio > 0 excludes gkd_ratio == 1.",
                             ge=0, le=1)
    pg_kl_method: Literal["k1", "topk_kl", "full_kl", "topk_jsd", "full_jsd"] = field("k1", "PG-branch estimator.")
    gkd_kl_method: Literal["k2", "k3", "topk_kl", "full_kl", "topk_jsd", "full_jsd"] = field(
        "topk_kl", "GKD-branch estimator.")
    topk: PositiveInt = field(256, "Logits kept by topk_* methods.")
    parallelism: TeacherParallelism = field(TeacherParallelism, "Teacher model parallelism.",
                                            "Teacher GPUs must divide by TP x PP x CP (giving teacher_dp).")
