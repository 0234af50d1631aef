"""A reward that can hold a run at a step the test chooses, so that a preemption lands at a known point
whatever the machine's speed.

The preemption tests stop a job twice. With steps of 0.1 s a signal sent "at step 3" landed at step 8 on
a loaded machine, and a run could finish before its second stop. So the test does not race the run: it
writes `hold_after_step` (N) into a control folder, and the first reward computed once step N is in the
run's metrics.jsonl waits (writing `holding_N`) until the test has seen the stop signal arrive and writes
`released_N`. The step being sampled cannot train before the stop is agreed, so the run stops after step N
(or, in the async loop, after the step whose groups were already sampled), however fast or slow it is.

Scored like math_answer; a run with nothing to hold scores exactly as one with the hold released.
It is a user component (`imports: [tests.launch.holding]`), as any user's reward would be.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dockyard.components.rewards import MathAnswer
from dockyard.registry import register

HOLD_LIMIT_S = 900.0


def latest_step(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]
    return max(steps, default=0)


@register("reward", "held_answer")
class HeldAnswer:
    """math_answer that waits at the step named in `control`/hold_after_step until it is released."""

    def __init__(self, control: str, metrics: str):
        self.control, self.metrics = Path(control), Path(metrics)
        self.score = MathAnswer()

    def __call__(self, completion: str, label: str) -> float:
        self._wait_if_held()
        return self.score(completion, label)

    def _wait_if_held(self) -> None:
        request = self.control / "hold_after_step"
        if not request.is_file():
            return
        step = int(request.read_text())
        released = self.control / f"released_{step}"
        if released.exists() or latest_step(self.metrics) < step:
            return
        (self.control / f"holding_{step}").write_text(str(latest_step(self.metrics)))
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not released.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"held after step {step} for {HOLD_LIMIT_S:.0f} s and never released "
                                   f"({released} was not written)")
            time.sleep(0.05)


def hold_overrides(workdir: Path, run_name: str = "grpo_tiny") -> tuple[str, ...]:
    """Config overrides that score a run with held_answer, controlled from workdir/hold."""
    control = workdir / "hold"
    control.mkdir(parents=True, exist_ok=True)
    metrics = workdir / "runs" / run_name / "logs" / "metrics.jsonl"
    return ("imports=[tests.launch.holding]",
            f"env.reward={{name: held_answer, control: '{control}', metrics: '{metrics}'}}")


def hold_after(workdir: Path, step: int) -> None:
    """From now on, the run holds once step `step` is logged (until release(workdir, step))."""
    target = workdir / "hold" / "hold_after_step"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.with_suffix(".tmp").write_text(str(step))
    target.with_suffix(".tmp").replace(target)


def is_holding(workdir: Path, step: int) -> bool:
    return (workdir / "hold" / f"holding_{step}").exists()


def release(workdir: Path, step: int) -> None:
    (workdir / "hold" / f"released_{step}").write_text("")
