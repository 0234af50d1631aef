"""Step metrics: TensorBoard scalars, a JSON-lines file, the experiment trackers (loggers.py), and the
console (a progress bar with ETA and a one-line summary per step)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from dockyard.config.schema.logger import LoggerConfig


class TensorBoardWriter:
    """TensorBoard event files under logger.log_dir."""

    def __init__(self, log_dir: str | Path, start_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        # after a resume, steps beyond the checkpoint (logged before a kill) are redone: drop the old ones
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=start_step + 1 if start_step else None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            if isinstance(value, list):   # a list metric (per-group lags): its histogram
                if value:
                    self.writer.add_histogram(name, torch.tensor(value, dtype=torch.float), step)
            else:
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class JsonlWriter:
    def __init__(self, path: Path, start_step: int = 0, machine: str | None = None):
        self.path = path
        self.machine = machine   # written into the first line of this (re)start, then dropped
        if start_step and path.is_file():
            # a resumed run redoes the steps after its checkpoint: their old lines go
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= start_step]
            if len(kept) != len(lines):
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
                tmp.replace(path)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        extra = {"machine": self.machine} if self.machine else {}
        self.machine = None
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, "time": time.time(), **metrics, **extra}) + "\n")

    def close(self) -> None:
        pass


class ConsoleProgress:
    """A bar over the run's steps (with ETA) and one summary line per step."""

    KEYS = (("reward/mean", "reward"), ("accuracy", "acc"), ("train/loss", "loss"), ("train/kl_ref", "kl"),
            ("train/entropy", "ent"), ("train/clip_fraction", "clip"), ("val/accuracy", "val_acc"),
            ("async/lag_max", "lag"), ("time/step", "s"))

    def __init__(self, total_steps: int, start_step: int):
        # a bar redrawn into a log file (Slurm) is noise: there the per-step line carries the ETA
        self.interactive = sys.stderr.isatty()
        self.total, self.done, self.started = total_steps, start_step, time.monotonic()
        self.first = start_step
        self.bar = tqdm(total=total_steps, initial=start_step, desc="grpo", unit="step", file=sys.stderr,
                        dynamic_ncols=True, leave=True, disable=not self.interactive)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        parts = [f"{short} {metrics[key]:.4g}" for key, short in self.KEYS if key in metrics]
        self.done += 1
        if not self.interactive:
            per_step = (time.monotonic() - self.started) / max(1, self.done - self.first)
            parts.append(f"eta {per_step * (self.total - self.done):.0f}s")
        self.bar.write(f"step {step}: " + "  ".join(parts), file=sys.stdout)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class MetricsLogger:
    """Every step's metrics to metrics.jsonl, TensorBoard and the enabled trackers (loggers.py), and the
    console. Raises loggers.LoggerStartError naming a tracker that cannot start."""

    def __init__(self, config: LoggerConfig, total_steps: int, start_step: int, run_name: str = "dockyard",
                 run_config: dict | None = None, machine: str | None = None):
        from dockyard.io.loggers import start_trackers

        log_dir = Path(config.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.sinks = [JsonlWriter(log_dir / "metrics.jsonl", start_step, machine)]
        if config.tensorboard_enabled:
            self.sinks.append(TensorBoardWriter(log_dir / "tensorboard", start_step))
        self.sinks += start_trackers(config, log_dir, run_name, run_config or {})
        self.console = ConsoleProgress(total_steps, start_step)

    def log(self, step: int, metrics: dict[str, float], console: bool = True) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)
        if console:
            self.console.step(step, metrics)
        else:
            self.console.bar.write(f"step {step}: " + "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.console.close()
