"""`logger`: metric backends, GPU monitoring and sample printing."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import NonNegativeInt

from dockyard.config.fields import Section, field


class WandbConfig(Section):
    project: Optional[str] = field(None, "W&B project; null: WANDB_PROJECT if set, else dockyard.")
    name: Optional[str] = field(None, "Run name; null uses the config's name.")
    mode: Optional[Literal["online", "offline"]] = field(None, "online needs WANDB_API_KEY (or a wandb login); "
                                                         "offline writes <log_dir>/wandb/ (or WANDB_DIR) for a later "
                                                         "`wandb sync` (compute nodes without internet). null: "
                                                         "WANDB_MODE if set (dryrun is offline), else online.")


class MlflowConfig(Section):
    tracking_uri: str = field("", "MLflow tracking URI: a server (http://...) or a local database "
                              "(sqlite:///path/mlflow.db); empty: MLFLOW_TRACKING_URI.",
                              "Required when mlflow_enabled (here or in MLFLOW_TRACKING_URI).")
    experiment_name: str = field("dockyard", "MLflow experiment.")


class SwanlabConfig(Section):
    project: str = field("dockyard", "SwanLab project.")
    mode: Optional[Literal["online", "offline"]] = field(None, "online needs SWANLAB_API_KEY (or a swanlab "
                                                         "login); offline writes <log_dir>/swanlab/ for a later "
                                                         "`swanlab sync`. null: SWANLAB_MODE if set, else online.")


class LoggerConfig(Section):
    log_dir: str = field(..., "Folder for TensorBoard events, per-step JSON metrics and component logs.")
    tensorboard_enabled: bool = field(True, "Write TensorBoard scalars.")
    wandb_enabled: bool = field(False, "Log to Weights & Biases.")
    mlflow_enabled: bool = field(False, "Log to MLflow.")
    swanlab_enabled: bool = field(False, "Log to SwanLab.")
    wandb: WandbConfig = field(WandbConfig, "W&B settings.")
    mlflow: MlflowConfig = field(MlflowConfig, "MLflow settings.")
    swanlab: SwanlabConfig = field(SwanlabConfig, "SwanLab settings.")
    monitor_gpus: bool = field(True, "Sample GPU utilisation and memory (nvidia-ml-py) when GPUs exist.")
    gpu_monitoring_interval_s: float = field(10.0, "GPU sampling interval.", "Not built: GPUs are sampled once "
                                             "per step; a value other than 10 is refused.", gt=0)
    num_samples_to_print: NonNegativeInt = field(0, "Trajectories printed to the console per step.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = field(
        "INFO", "Python logging level of the trainer ranks and the embedded engine, and the generation servers' "
        "own (VLLM_LOGGING_LEVEL, SGLang --log-level). dockyard's step lines and warnings always print.")
