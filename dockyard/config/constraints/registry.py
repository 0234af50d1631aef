"""The list of cross-field rules and advice, and the helpers they share; the rules themselves live in
the modules of this package, one per section they check."""

from __future__ import annotations

from typing import Callable, Iterable

from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig

Rule = Callable[[MasterConfig], Iterable[Problem]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def check(cfg: MasterConfig) -> list[Problem]:
    return [problem for each in RULES for problem in each(cfg)]


# Advice: settings that are valid but recommended against; shown, never refused.
ADVICE: list[Rule] = []


def advice(fn: Rule) -> Rule:
    ADVICE.append(fn)
    return fn


def advise(cfg: MasterConfig) -> list[Problem]:
    return [problem for each in ADVICE for problem in each(cfg)]


def devices_word(cfg: MasterConfig) -> str:
    return "GPUs" if cfg.cluster.gpus_per_node > 0 else "ranks"


def mutually_divisible(a: int, b: int) -> bool:
    return a > 0 and b > 0 and (a % b == 0 or b % a == 0)


