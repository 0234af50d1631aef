"""A task family: a generator of terminal tasks of one kind of everyday shell work, parameterised by a
seeded random source and a difficulty level. Each instance carries its workspace files, the oracle's
shell commands and the pytest tests that decide it; writing.py turns it into a Terminal-Bench task
folder."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "candle", "forest", "silver",
         "rocket", "garden", "bridge", "window", "pepper", "violet", "falcon", "harbor", "meadow", "copper",
         "orange", "planet", "winter", "summer", "shadow", "marble", "ribbon", "anchor", "velvet", "cactus",
         "walnut", "saddle", "lantern", "canyon", "glacier", "thunder", "compass", "blossom", "harvest")
NAMES = ("alice", "bruno", "chen", "dara", "emil", "farah", "goran", "hana", "ivan", "jonas", "kira", "lena",
         "mateo", "nina", "omar", "priya", "quinn", "rosa", "sven", "tara", "uma", "viktor", "wren", "yusuf")


@dataclass(frozen=True)
class TaskInstance:
    family: str
    category: str
    level: int
    instruction: str
    files: dict[str, str]        # workspace path -> text (the task's files/, copied to /app)
    solution: str                # the oracle: bash run in /app
    tests: str                   # the body of tests/test_outputs.py (pytest; the workspace is /app)
    executable: frozenset[str] = field(default_factory=frozenset)   # workspace files written with mode 755


class Family:
    """Subclasses set `name`, `category`, `levels` and write `make`."""

    name: str
    category: str
    levels: tuple[int, ...] = (1, 2, 3)

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        raise NotImplementedError

    def task(self, level: int, instruction: str, files: dict[str, str], solution: str, tests: str,
             executable: frozenset[str] = frozenset()) -> TaskInstance:
        return TaskInstance(self.name, self.category, level, instruction, files, solution.strip() + "\n",
                            "from pathlib import Path\nimport subprocess\n\nAPP = Path('/app')\n\n\n" + tests.strip() + "\n",
                            executable)


def words(rng: random.Random, count: int, pool: tuple[str, ...] = WORDS) -> list[str]:
    return [rng.choice(pool) for _ in range(count)]


def distinct(rng: random.Random, count: int, pool: tuple[str, ...] = WORDS) -> list[str]:
    return rng.sample(pool, count)


def text_lines(rng: random.Random, count: int, per_line: tuple[int, int] = (3, 7)) -> list[str]:
    return [" ".join(words(rng, rng.randint(*per_line))) for _ in range(count)]


def file_name(rng: random.Random, suffix: str) -> str:
    return f"{rng.choice(WORDS)}{suffix}"
