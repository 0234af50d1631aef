"""The trainer ranks' entry point: the loop a config asks for, started on every rank. The choice sits
above the loops (each loop is a module of its own that imports no other loop to dispatch).

    python -m dockyard.loop     # started by `dockyard run` (run/local.py) or a Slurm job (launch/job.py)
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch
import torch.distributed as dist

from dockyard.config import topology
from dockyard.config.errors import ConfigError
from dockyard.config.loader import read_resolved
from dockyard.config.schema import MasterConfig
from dockyard.distributed import init_trainer_world
from dockyard.errors import DockyardError
from dockyard.loop import stopping
from dockyard.loop.async_grpo import AsyncGRPOTrainer
from dockyard.loop.distillation import OnPolicyDistillationTrainer
from dockyard.loop.grpo import GRPOTrainer
from dockyard.loop.plane_grpo import DataPlaneGRPOTrainer
from dockyard.loop.sft import SFTTrainer
from dockyard.loop.trainer import Trainer
from dockyard.loop.stopping import RunStopped


def loop_for(cfg: MasterConfig) -> type[Trainer]:
    """The trainer class of the config's loop; each loop lives in its own module."""
    if cfg.sft is not None:
        return SFTTrainer
    if cfg.grpo.adv_estimator.name == "opd":
        return OnPolicyDistillationTrainer
    if cfg.data_plane is not None:
        return DataPlaneGRPOTrainer
    if cfg.grpo.async_grpo.enabled:
        return AsyncGRPOTrainer
    return GRPOTrainer


def main(stopper: "stopping.StopRequests | None" = None) -> int:
    config_path = os.environ["DOCKYARD_CONFIG"]
    try:
        cfg = read_resolved(config_path)
    except ConfigError as err:
        print(f"dockyard: {err}", file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(level=cfg.logger.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if cfg.logger.log_level != "DEBUG":
        # one INFO line per generation request would bury everything else
        for chatty in ("httpx", "httpcore"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    threads = int(os.environ.get("DOCKYARD_THREADS", "0"))
    if threads:
        torch.set_num_threads(threads)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cfg.cluster.gpus_per_node > 0 \
        else torch.device("cpu")
    torch.manual_seed(cfg.policy.seed)
    stopper = stopper or stopping.NoStops()
    if stopper.device is None:
        stopper.device = device
    world = init_trainer_world(device, timeout_s=float(os.environ.get("DOCKYARD_COLLECTIVE_TIMEOUT_S", 1800)),
                               model_parallel_size=topology.model_parallel_size(cfg))
    try:
        trainer = loop_for(cfg)(cfg, world, device, json.loads(os.environ.get("DOCKYARD_REPLICAS", "[]")),
                                int(os.environ.get("DOCKYARD_WEIGHT_SYNC_PORT", 0)))
        trainer.stopper = stopper
        if world.is_main and stopper.can_stop:
            stopper.on_signal = trainer.abort_generation
        trainer.run()
    except DockyardError as err:   # it names what is wrong; a traceback would only bury that
        print(f"dockyard: {err.report()}", file=sys.stderr, flush=True)
        return err.exit_status
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def local_rank_main() -> int:
    """A trainer rank of `dockyard run`. The driver turns Ctrl-C and SIGTERM into a SIGTERM to every
    rank (run/local.py); the ranks agree on it at the next safe point, save and exit 0."""
    stopper = stopping.StopRequests(device=None).install()
    try:
        return main(stopper)
    except RunStopped as stop:
        print(f"dockyard: {stop}", file=sys.stderr, flush=True)
        return 0
