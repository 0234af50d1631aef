"""Slurm's time-limit formats (sbatch --time), read into minutes."""

from __future__ import annotations

import re

from dockyard.errors import DockyardError


class SlurmTimeError(DockyardError, ValueError):
    pass


_FORMATS = [
    (re.compile(r"^(\d+)-(\d+)$"), ("days", "hours")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("days", "hours", "minutes")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("days", "hours", "minutes", "seconds")),
    (re.compile(r"^(\d+)$"), ("minutes",)),
    (re.compile(r"^(\d+):(\d+)$"), ("minutes", "seconds")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("hours", "minutes", "seconds")),
]
_MINUTES = {"days": 1440, "hours": 60, "minutes": 1, "seconds": 1 / 60}


def minutes(value: int | str) -> float:
    """Minutes in a Slurm time limit: 90, "90", "1:30:00", "2-00:00:00"."""
    if isinstance(value, int):
        return float(value)
    text = value.strip()
    for pattern, units in _FORMATS:
        match = pattern.match(text)
        if match:
            return sum(int(v) * _MINUTES[u] for v, u in zip(match.groups(), units))
    raise SlurmTimeError(f"{value!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                         "D-HH:MM:SS)")


def sbatch_time(value: int | str) -> str:
    """The limit as sbatch writes it (whole minutes round up: Slurm's own granularity)."""
    total = int(-(-minutes(value) // 1))
    days, rest = divmod(total, 1440)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"
