"""A loop run inside the test process: the config through the preflight, the loop `dockyard run` would
pick, one gloo rank, and a real embedded-engine server over HTTP (refits included). A run takes a
second or two instead of the ~50 s of `dockyard run`'s process start-ups on 2 cores, so the tests of
what a setting does to the loop use it. What the processes do (two ranks, signals, dead components,
resume in a new process) stays with `dockyard run` (test_local_run.py and the Slurm tests)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class LoopRun:
    workdir: Path
    output: str      # what the preflight and the loop printed

    @property
    def logs(self) -> Path:
        return self.workdir / "runs" / "grpo_tiny" / "logs"

    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.logs / "metrics.jsonl").read_text().splitlines()]


class InProcessLoop:
    def __init__(self, model: Path, server_url: str, server_log: Path):
        self.model, self.server = model, {"name": "generation server (embedded)", "url": server_url,
                                          "log": str(server_log)}

    def __call__(self, workdir: Path, *overrides: str, config: str = "grpo_tiny.yaml") -> LoopRun:
        """The run in `workdir` (relative paths and `imports:` resolve there, as for `dockyard run`
        started in it); a failing preflight fails the test with its report."""
        from dockyard.config import load_config
        from dockyard.distributed import WorldInfo
        from dockyard.loop.entry import loop_for
        from dockyard.preflight import preflight

        workdir.mkdir(parents=True, exist_ok=True)
        previous = Path.cwd()
        # a jax run fixes this process's host device count in XLA_FLAGS; the commands a later test starts
        # must not inherit it (a jax run of 2 devices would find 1 and stop)
        xla_flags = os.environ.get("XLA_FLAGS")
        out = io.StringIO()
        os.chdir(workdir)
        try:
            with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
                loaded = load_config(config, [f"models_dir={self.model.parent}", *overrides])
                report = preflight(loaded.config, "local")
                report.print("dockyard run", loaded.source)
                assert not report.problems, out.getvalue()
                cfg = loaded.config
                torch.manual_seed(cfg.policy.seed)
                trainer = loop_for(cfg)(cfg, WorldInfo(0, 1, 0), torch.device("cpu"), [self.server], 0)
                trainer.run()
        except BaseException:
            sys.stderr.write(out.getvalue()[-5000:])
            raise
        finally:
            os.chdir(previous)
            if xla_flags is None:
                os.environ.pop("XLA_FLAGS", None)
            else:
                os.environ["XLA_FLAGS"] = xla_flags
        return LoopRun(workdir, out.getvalue())
