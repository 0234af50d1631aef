"""Config problems are collected, never raised one at a time: a user waiting hours in a queue
wants the whole list at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dockyard.errors import DockyardError


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(DockyardError):
    def __init__(self, problems: list[Problem], source: str | Path | None = None):
        self.problems = list(problems)
        self.source = str(source) if source is not None else None
        super().__init__(self.render())

    def render(self) -> str:
        where = f"config {self.source}" if self.source else "config"
        count = len(self.problems)
        lines = [f"{where} is invalid ({count} problem{'s' if count != 1 else ''}):"]
        lines += [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)
