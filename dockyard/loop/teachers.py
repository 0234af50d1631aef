"""Teachers for on-policy distillation: which teacher scores a rollout, and the scoring itself.

Each teacher of `on_policy_distillation.teachers` is served by generation servers of its own (the
run's generation backend, loaded from the teacher's folder; `dockyard run` starts them here,
`dockyard-submit` on the teacher component). Scoring is prefill only: a rollout's prompt + response
token ids go in, the teacher's logprob of every response token comes out (`Generator.score`), no
token is generated.

Which teacher scores which rollout: data/teacher_routing.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from dockyard.data.datasets import Prompt
from dockyard.data.teacher_routing import TeacherRouting, TeacherRoutingError
from dockyard.generation.generator import Generator
from dockyard.policy.samples import Sample

class TeacherScorer:
    """Rank 0's client of every teacher's servers (one Generator per teacher, a fleet when it has
    several replicas). The teachers score concurrently."""

    def __init__(self, teachers: dict[str, Generator], routing: TeacherRouting):
        missing = [name for name in routing.names if name not in teachers]
        if missing:
            raise TeacherRoutingError(f"no server was started for teacher(s) {', '.join(missing)}")
        self.teachers, self.routing = teachers, routing

    def score(self, samples: list[Sample], prompts: list[Prompt]) -> tuple[list[list[float]], dict[str, float]]:
        """The teacher's logprob of each response token of each sample (samples[i] from prompts[i])."""
        chosen = [self.routing.teacher(p) for p in prompts]
        out: list[list[float] | None] = [None] * len(samples)
        seconds: dict[str, float] = {}

        def run(name: str) -> None:
            indices = [i for i, teacher in enumerate(chosen) if teacher == name]
            started = time.perf_counter()
            got = self.teachers[name].score([samples[i].token_ids for i in indices],
                                            [samples[i].prompt_length for i in indices])
            seconds[name] = time.perf_counter() - started
            for i, logprobs in zip(indices, got):
                if len(logprobs) != samples[i].response_length:
                    raise TeacherRoutingError(f"teacher {name!r} returned {len(logprobs)} logprobs for a response "
                                              f"of {samples[i].response_length} tokens")
                out[i] = logprobs

        names = sorted(set(chosen))
        if names:
            with ThreadPoolExecutor(max_workers=len(names)) as pool:
                for future in [pool.submit(run, name) for name in names]:
                    future.result()
        metrics = {f"opd/rollouts_{name}": float(chosen.count(name)) for name in self.routing.names}
        metrics |= {f"opd/score_seconds_{name}": s for name, s in seconds.items()}
        return out, metrics  # type: ignore[return-value]

    def close(self) -> None:
        for teacher in self.teachers.values():
            close = getattr(teacher, "close", None)
            if close is not None:
                close()


def teacher_model_folder(teacher, export_root) -> str:
    """The folder a teacher's servers load: its hf_path, or (checkpoint_path set) that dockyard step's
    weights written as an HF folder under `export_root` with hf_path's structure and tokenizer."""
    if not teacher.checkpoint_path:
        return teacher.hf_path
    from pathlib import Path

    from dockyard.io.hf_export import export_checkpoint

    return str(export_checkpoint(teacher.checkpoint_path, teacher.hf_path, Path(export_root) / teacher.name))
