"""Generated task sets whose splits measure generalisation:

    train/     instances of the trained families
    heldout/   new instances of the same families (other seeds; no file of more than 32 bytes and no
               whole task shared with train)
    unseen/    instances of families never trained on (`unseen`, two by default)

and <split>.jsonl beside them (the dataset rows a config reads: instruction, task.path). Every
instance comes from a random source seeded by (seed, split, family, index), so the same plan writes
the same bytes (modes included) on any machine; plan.json records the plan.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dockyard.envs.terminal_families.core import Family, TaskInstance
from dockyard.envs.terminal_families.data_families import CsvJoin, CsvSum, JsonField
from dockyard.envs.terminal_families.file_families import FindFiles, Permissions, RenameFiles
from dockyard.envs.terminal_families.script_families import FixScript, GitOps
from dockyard.envs.terminal_families.text_families import CountLines, LogSummary, ReplaceText, SortUnique
from dockyard.envs.terminal_families.writing import write_task
from dockyard.errors import DockyardError

FAMILIES: dict[str, Family] = {f.name: f for f in (
    CountLines(), SortUnique(), ReplaceText(), LogSummary(), CsvSum(), CsvJoin(), JsonField(), FindFiles(),
    RenameFiles(), Permissions(), FixScript(), GitOps())}
DEFAULT_UNSEEN = ("log_summary", "csv_join")
SHARED_BYTES = 32   # shorter file contents (a word, a greeting) may recur between splits


class PlanError(DockyardError, ValueError):
    """A generation parameter that cannot be honoured; the message names it."""


@dataclass(frozen=True)
class SplitPlan:
    seed: int = 0
    train_per_family: int = 24
    heldout_per_family: int = 6
    unseen_per_family: int = 6
    unseen: tuple[str, ...] = DEFAULT_UNSEEN
    families: tuple[str, ...] = field(default_factory=lambda: tuple(FAMILIES))
    levels: tuple[int, ...] = (1, 2, 3)

    def check(self) -> None:
        problems = []
        for name in ("train_per_family", "heldout_per_family", "unseen_per_family"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0 or value > 10_000:
                problems.append(f"{name}: {value!r} is not a count from 0 to 10000")
        if self.train_per_family < 1:
            problems.append("train_per_family: the train split needs at least 1 task per family")
        unknown = [f for f in (*self.families, *self.unseen) if f not in FAMILIES]
        if unknown:
            problems.append(f"families: {', '.join(map(repr, unknown))} is not a family (known: {', '.join(FAMILIES)})")
        if not set(self.unseen) < set(self.families):
            problems.append("unseen: the held-out families must be some of the families, leaving at least one to train")
        if not self.levels or any(level not in (1, 2, 3) for level in self.levels):
            problems.append(f"levels: {list(self.levels)!r} must be some of 1, 2, 3")
        if not isinstance(self.seed, int) or self.seed < 0:
            problems.append(f"seed: {self.seed!r} is not a non-negative integer")
        if problems:
            raise PlanError("task family plan refused:\n  - " + "\n  - ".join(problems))

    def trained(self) -> list[str]:
        return [f for f in self.families if f not in self.unseen]


def _levels(family: Family, wanted: tuple[int, ...]) -> list[int]:
    return [level for level in family.levels if level in wanted] or [max(family.levels)]


def _fingerprint(task: TaskInstance) -> tuple:
    return task.instruction, tuple(sorted(task.files.items()))


def instances(plan: SplitPlan, split: str, families: list[str], count: int,
              avoid: tuple[set, set] | None = None) -> list[tuple[str, TaskInstance]]:
    """(folder name, instance) of `count` tasks per family, levels in turn; with `avoid` (the train
    split's long file contents and whole tasks), an instance sharing one is drawn again (next attempt)."""
    out = []
    for name in families:
        family, levels = FAMILIES[name], _levels(FAMILIES[name], plan.levels)
        for index in range(count):
            level = levels[index % len(levels)]
            for attempt in range(100):
                task = family.make(random.Random(f"{plan.seed}/{split}/{name}/{index}/{attempt}"), level)
                if avoid is None or not (_fingerprint(task) in avoid[1] or any(
                        len(text) > SHARED_BYTES and text in avoid[0] for text in task.files.values())):
                    break
            else:
                raise PlanError(f"{split}: no instance of {name} level {level} unlike the train split in 100 draws")
            out.append((f"{name}-{level}-{index:03d}", task))
    return out


def generate(plan: SplitPlan, out: str | Path) -> dict[str, int]:
    """Write the three splits under `out` (which must not hold files yet); the tasks per split."""
    plan.check()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise PlanError(f"{out}: not empty; generate into a new folder (the same plan writes the same bytes)")
    train = instances(plan, "train", plan.trained(), plan.train_per_family)
    seen = ({text for _, t in train for text in t.files.values() if len(text) > SHARED_BYTES},
            {_fingerprint(t) for _, t in train})
    splits = {"train": train,
              "heldout": instances(plan, "heldout", plan.trained(), plan.heldout_per_family, seen),
              "unseen": instances(plan, "unseen", list(plan.unseen), plan.unseen_per_family)}
    out.mkdir(parents=True, exist_ok=True)
    for split, tasks in splits.items():
        rows = []
        for name, task in tasks:
            write_task(task, out / split / name)
            rows.append({"instruction": task.instruction, "task": {"path": f"{split}/{name}", "name": name,
                                                                   "family": task.family, "level": task.level,
                                                                   "split": split}})
        (out / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (out / "plan.json").write_text(json.dumps(asdict(plan), indent=2) + "\n")
    return {split: len(tasks) for split, tasks in splits.items()}
