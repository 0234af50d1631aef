"""Experiment trackers beside TensorBoard: Weights & Biases, MLflow and SwanLab, any combination.

Each is a sink of MetricsLogger (metrics.py) with `log(step, metrics)` and `close()`. A list-valued
metric (per-group lags, each replica's request seconds) goes whole to W&B as a histogram; MLflow and
SwanLab take scalars only, so it reaches them as `<name>/mean`, `/p50`, `/p90` and `/max`, per-worker
lists (`<name>/replica<i>`) merged into one `<name>` first.

A tracker starts when the loop starts, before the first step: one that cannot start (not installed,
no credentials for an online mode, an unreachable store) is a LoggerStartError naming its setting,
never a crash in the middle of a run. After a requeue each continues the same run (its id is kept in
<log_dir>/<tracker>_run_id).

The trackers' own environment variables count where the config leaves a setting unset (null, or an
empty tracking URI): WANDB_MODE, WANDB_PROJECT, WANDB_DIR, MLFLOW_TRACKING_URI, SWANLAB_MODE. A setting
in the config wins over its variable.

Each tracker is a registered `logger` component (the catalog names these classes), found by name.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from pathlib import Path
from typing import Any

from dockyard.config.schema.logger import LoggerConfig
from dockyard.errors import DockyardError

# the pip package each tracker needs: tools/install.sh installs them (pyproject extra "loggers")
PACKAGES = {"wandb_enabled": ("wandb", "wandb"), "mlflow_enabled": ("mlflow", "mlflow-skinny sqlalchemy alembic"),
            "swanlab_enabled": ("swanlab", "swanlab")}


class LoggerStartError(DockyardError, RuntimeError):
    label = "logger error"


def missing_packages(config: LoggerConfig) -> list[tuple[str, str]]:
    """(setting, pip command) for each enabled tracker whose package is not installed."""
    return [(f"logger.{setting}", f"pip install {pip}") for setting, (module, pip) in PACKAGES.items()
            if getattr(config, setting) and importlib.util.find_spec(module) is None]


def merged_workers(metrics: dict[str, Any]) -> dict[str, Any]:
    """Per-worker lists (`<name>/replica<i>`, the generation timeline) joined into one `<name>` list."""
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        match = re.fullmatch(r"(.+)/replica\d+", name)
        if match and isinstance(value, list):
            out.setdefault(match.group(1), []).extend(value)
        else:
            out[name] = value
    return out


def scalar_summary(metrics: dict[str, Any]) -> dict[str, float]:
    """Scalars as they are; a list (per-worker lists merged first) as its mean, median, 90th percentile
    and max (an empty one is left out): one bounded set of keys per metric."""
    import numpy as np

    out = {}
    for name, value in merged_workers(metrics).items():
        if isinstance(value, list):
            if value:
                values = np.asarray(value, dtype=float)
                out.update({f"{name}/mean": float(values.mean()), f"{name}/p50": float(np.percentile(values, 50)),
                            f"{name}/p90": float(np.percentile(values, 90)), f"{name}/max": float(values.max())})
        elif isinstance(value, (int, float)):
            out[name] = float(value)
    return out


def _tracker_module(setting: str):
    """The enabled tracker's package, or a LoggerStartError naming the switch and the install command."""
    import importlib

    module, pip = PACKAGES[setting]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise LoggerStartError(f"logger.{setting}: {module} is not installed (pip install {pip})") from None


def setting(value, variable: str, default, allowed: dict | None = None, field: str = ""):
    """The config's value; where it is unset, the tracker's environment variable (mapped through
    `allowed`, refused by name outside it), else the default."""
    if value not in (None, ""):
        return value
    from_env = os.environ.get(variable)
    if not from_env:
        return default
    if allowed is not None:
        if from_env.lower() not in allowed:
            raise LoggerStartError(f"{field}: unset, and {variable}={from_env!r} is not one of "
                                   f"{', '.join(allowed)}; set {field} or {variable} to one of them")
        return allowed[from_env.lower()]
    return from_env


def _run_id(log_dir: Path, tracker: str) -> tuple[Path, str | None]:
    path = log_dir / f"{tracker}_run_id"
    return path, (path.read_text().strip() or None) if path.is_file() else None


class WandbWriter:
    def __init__(self, config: LoggerConfig, log_dir: Path, run_name: str, run_config: dict):
        wandb = _tracker_module("wandb_enabled")
        settings = config.wandb
        mode = setting(settings.mode, "WANDB_MODE", "online", {"online": "online", "run": "online",
                                                                "offline": "offline", "dryrun": "offline"},
                       "logger.wandb.mode")
        project = setting(settings.project, "WANDB_PROJECT", "dockyard")
        folder = setting(None, "WANDB_DIR", str(log_dir))
        if mode == "online" and not (os.environ.get("WANDB_API_KEY") or _netrc_has("api.wandb.ai")):
            raise LoggerStartError("logger.wandb.mode is online but no W&B credentials were found (set "
                                   "WANDB_API_KEY or run `wandb login`); on nodes without internet set "
                                   "logger.wandb.mode=offline (or WANDB_MODE=offline) and `wandb sync` later")
        id_file, run_id = _run_id(log_dir, "wandb")
        # a parent process that used wandb (a notebook, a test session) leaves WANDB_SERVICE pointing at
        # its own wandb-core; this run's records must not depend on that process staying alive
        os.environ.pop("WANDB_SERVICE", None)
        try:
            self.run = wandb.init(project=project, name=settings.name or run_name, mode=mode,
                                  dir=folder, config=run_config, id=run_id, resume="allow" if run_id else None,
                                  settings=wandb.Settings(console="off", silent=True))
        except Exception as err:   # wandb raises its own errors for network and auth failures
            raise LoggerStartError(f"logger.wandb_enabled: W&B did not start: {type(err).__name__}: {err}") from None
        id_file.write_text(self.run.id)
        self.wandb = wandb

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        data = {name: (self.wandb.Histogram(value) if isinstance(value, list) else value)
                for name, value in metrics.items() if not isinstance(value, list) or value}
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()


def _netrc_has(host: str) -> bool:
    import netrc

    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class MlflowWriter:
    def __init__(self, config: LoggerConfig, log_dir: Path, run_name: str, run_config: dict):
        os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")   # mlflow probes git; a node without it is fine
        _tracker_module("mlflow_enabled")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
        settings = config.mlflow
        uri = setting(settings.tracking_uri, "MLFLOW_TRACKING_URI", "")
        if not uri:
            raise LoggerStartError("logger.mlflow.tracking_uri: required when logger.mlflow_enabled is true "
                                   "(or set MLFLOW_TRACKING_URI)")
        id_file, run_id = _run_id(log_dir, "mlflow")
        try:
            self.client = MlflowClient(uri)
            if run_id is None:
                experiment = self.client.get_experiment_by_name(settings.experiment_name)
                experiment_id = (experiment.experiment_id if experiment is not None
                                 else self.client.create_experiment(settings.experiment_name))
                run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
                flat = _flatten(run_config)
                self.client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in flat.items()])
            else:
                self.client.update_run(run_id, status="RUNNING")
        except Exception as err:   # a bad URI, an unreachable server, a locked database
            raise LoggerStartError(f"logger.mlflow.tracking_uri: MLflow at {uri!r} did not "
                                   f"start: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                                   ) from None
        id_file.write_text(run_id)
        self.run_id, self.metric = run_id, Metric

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        now = int(time.time() * 1000)
        batch = [self.metric(name, value, now, step) for name, value in scalar_summary(metrics).items()]
        for start in range(0, len(batch), 1000):   # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=batch[start:start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class SwanlabWriter:
    def __init__(self, config: LoggerConfig, log_dir: Path, run_name: str, run_config: dict):
        swanlab = _tracker_module("swanlab_enabled")
        settings = config.swanlab
        mode = setting(settings.mode, "SWANLAB_MODE", "online", {"online": "online", "cloud": "online",
                                                                  "offline": "offline", "local": "offline"},
                       "logger.swanlab.mode")
        if mode == "online" and not os.environ.get("SWANLAB_API_KEY"):
            raise LoggerStartError("logger.swanlab.mode is online but SWANLAB_API_KEY is not set; on nodes without "
                                   "internet set logger.swanlab.mode=offline (or SWANLAB_MODE=offline) and "
                                   "`swanlab sync` later")
        id_file, run_id = _run_id(log_dir, "swanlab")
        try:
            self.run = swanlab.init(project=settings.project, name=run_name, mode=mode,
                                    log_dir=str(log_dir / "swanlab"), config=run_config,
                                    **({"id": run_id, "resume": "allow"} if run_id else {}))
        except Exception as err:
            raise LoggerStartError(f"logger.swanlab_enabled: SwanLab did not start: {type(err).__name__}: {err}"
                                   ) from None
        id_file.write_text(str(self.run.id))
        self.swanlab = swanlab

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.swanlab.log(scalar_summary(metrics), step=step)

    def close(self) -> None:
        self.swanlab.finish()


TRACKERS = (("wandb_enabled", "wandb"), ("mlflow_enabled", "mlflow"), ("swanlab_enabled", "swanlab"))


def start_trackers(config: LoggerConfig, log_dir: Path, run_name: str, run_config: dict) -> list:
    """The enabled trackers (registered `logger` components), started; the first that fails closes the
    ones already started."""
    from dockyard import registry

    started = []
    try:
        for switch, name in TRACKERS:
            if getattr(config, switch):
                started.append(registry.build("logger", name, config=config, log_dir=log_dir, run_name=run_name,
                                              run_config=run_config))
    except LoggerStartError:
        for tracker in started:
            tracker.close()
        raise
    return started
