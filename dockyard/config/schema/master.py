"""MasterConfig: the whole run. Extra top-level keys are allowed (subsystems read their own
sub-trees); the listed sections are required."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from dockyard.config.fields import field
from dockyard.config.schema.checkpointing import CheckpointingConfig
from dockyard.config.schema.cluster import ClusterConfig
from dockyard.config.schema.data import DataConfig
from dockyard.config.schema.distillation import OnPolicyDistillationConfig
from dockyard.config.schema.env import EnvConfig
from dockyard.config.schema.grpo import GRPOConfig
from dockyard.config.schema.logger import LoggerConfig
from dockyard.config.schema.loss import LossConfig
from dockyard.config.schema.policy import PolicyConfig
from dockyard.config.schema.data_plane import DataPlaneConfig
from dockyard.config.schema.sft import SFTConfig


class MasterConfig(BaseModel):
    model_config = ConfigDict(extra="allow", validate_default=True)

    name: Optional[str] = field(None, "Run name used in logs and job names; null uses the config file name.")
    imports: list[str] = field([], "Python modules imported before validation so their "
                               "@register components can be selected by name.")
    policy: PolicyConfig = field(..., "The trained model, its backend, optimizer and generation engine.")
    loss_fn: LossConfig = field(..., "Policy loss, reference KL and off-policy safeguards.")
    grpo: GRPOConfig = field(..., "The RL loop.")
    env: EnvConfig = field(..., "Environment, agent, reward and sandbox.")
    data: DataConfig = field(..., "Datasets.")
    cluster: ClusterConfig = field(..., "Nodes, GPUs and the trainer / rollout / teacher split.")
    logger: LoggerConfig = field(..., "Logging backends.")
    checkpointing: CheckpointingConfig = field(..., "Checkpoint cadence, retention and resume.")
    data_plane: Optional[DataPlaneConfig] = field(None, "External experience-transfer plane; null uses the "
                                                  "in-memory path.", "Refused by OPD.")
    sft: Optional[SFTConfig] = field(None, "Present for supervised fine-tuning runs.")
    on_policy_distillation: Optional[OnPolicyDistillationConfig] = field(
        None, "Teachers for on-policy distillation.", "Required when grpo.adv_estimator.name is opd.")

SECTIONS = [name for name in MasterConfig.model_fields if name not in ("name", "imports")]
