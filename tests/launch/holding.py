"""A reward that can hold a run at a step the test chooses, so that a preemption lands at a known point
whatever the machine's speed.

The preemption tests stop a job twice. With steps of 0.1 s a signal sent "at step 3" landed at step 8 on
a loaded machine, and a run could finish before its second stop. So the test does not race the run: it
writes `hold_after_step` (N) into a control folder, and the first reward computed once step N is in the
run's metrics.jsonl waits (writing `holding_N`) until the test has seen the stop signal arrive and writes
`released_N`. The step being sampled cannot train before the stop is agreed, so the run stops after step N
(or, in the async loop, after the step whose groups were already sampled), however fast or slow it is.

Scored like math_answer; a run with nothing to hold scores exactly as one with the hold released.
The reward is a user component (tests/launch/held_reward.py, `imports: [tests.launch.held_reward]`), as any
user's reward would be, registered only in the jobs that import it; this module holds the test's side.
"""

from __future__ import annotations

from pathlib import Path


def hold_overrides(workdir: Path, run_name: str = "grpo_tiny") -> tuple[str, ...]:
    """Config overrides that score a run with held_answer, controlled from workdir/hold."""
    control = workdir / "hold"
    control.mkdir(parents=True, exist_ok=True)
    metrics = workdir / "runs" / run_name / "logs" / "metrics.jsonl"
    return ("imports=[tests.launch.held_reward]",
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
