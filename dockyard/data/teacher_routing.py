"""Which teacher scores a rollout in on-policy distillation (V4's per-context teacher selection): a
pure function of the config and the prompt, so the preflight can route every training row before
anything starts and the loop routes each rollout the same way (loop/teachers.py scores).

A rollout's *agent name* is its dataset row's `metadata.agent_name`, else the configured `env.agent`.
The teacher is, in this order: teacher_model_by_agent_name[agent name]; the row's dataset's
`teacher_name`; `default_teacher`. A rollout with an agent name that none of these resolves is an
error naming the agent; one with no agent name at all goes to the first teacher.
"""

from __future__ import annotations

from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import Prompt
from dockyard.errors import DockyardError

AGENT_NAME_KEY = "agent_name"


class TeacherRoutingError(DockyardError, ValueError):
    pass


class TeacherRouting:
    def __init__(self, cfg: MasterConfig):
        opd = cfg.on_policy_distillation
        self.names = [t.name for t in opd.teachers]
        self.by_agent = dict(opd.teacher_model_by_agent_name)
        self.by_dataset = {d.name: d.teacher_name for d in cfg.data.datasets if d.teacher_name}
        self.default = opd.default_teacher
        self.env_agent = cfg.env.agent

    def agent_name(self, prompt: Prompt) -> str | None:
        return prompt.metadata.get(AGENT_NAME_KEY) or self.env_agent

    def teacher(self, prompt: Prompt) -> str:
        agent = self.agent_name(prompt)
        if agent is not None and agent in self.by_agent:
            return self.by_agent[agent]
        if prompt.source in self.by_dataset:
            return self.by_dataset[prompt.source]
        if self.default is not None:
            return self.default
        if agent is not None:
            known = ", ".join(sorted(self.by_agent)) or "none"
            raise TeacherRoutingError(
                f"a rollout of dataset {prompt.source!r} has agent name {agent!r}, which "
                f"on_policy_distillation.teacher_model_by_agent_name does not map (it maps: {known}); add it, set "
                f"data.datasets[].teacher_name for {prompt.source!r}, or set on_policy_distillation.default_teacher")
        return self.names[0]

    def check(self, prompts: list[Prompt]) -> dict[str, int]:
        """Route every prompt once before anything runs: an unknown agent name fails at start-up. Returns
        how many prompts each teacher gets."""
        counts = dict.fromkeys(self.names, 0)
        for prompt in prompts:
            counts[self.teacher(prompt)] += 1
        return counts
