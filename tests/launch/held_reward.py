"""The reward that holds a run at a step its test chooses (tests/launch/holding.py has the why and the
test's side). A user component: a job imports it through `imports: [tests.launch.held_reward]`, so it is
registered only there, not in every test process."""

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
