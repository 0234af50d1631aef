"""What crosses the broker, as JSON (never pickle: whoever can write to the broker must not be able to
run code in the trainer): a prompt task for the workers, a finished group for the trainer."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from dockyard.data.datasets import Prompt
from dockyard.errors import ComponentError
from dockyard.loop.rollouts import Group, Trajectory
from dockyard.policy.samples import Sample


class BadMessage(ComponentError):
    label = "data plane"


def encode_prompt(prompt: Prompt) -> str:
    try:
        return json.dumps(asdict(prompt))
    except TypeError as err:
        raise BadMessage(f"dataset {prompt.source!r}: a row cannot be sent to the rollout workers as JSON ({err})") from None


def decode_prompt(text: str) -> Prompt:
    return Prompt(**json.loads(text))


_TRAJECTORY_FIELDS = {f.name for f in fields(Trajectory)} - {"sample"}
_SAMPLE_FIELDS = {f.name for f in fields(Sample)}


def encode_trajectories(group: Group) -> str:
    """The group's trajectories (its prompt stays behind: the trainer has the row)."""
    return json.dumps([{**{k: v for k, v in asdict(t).items() if k != "sample"}, "sample": asdict(t.sample)}
                       for t in group.trajectories])


def decode_group(text: str, prompt: Prompt, where: str) -> Group:
    """A group from a worker; a message that is not one names where it came from."""
    try:
        rows = json.loads(text)
        trajectories = []
        for row in rows:
            sample = row.pop("sample")
            unknown = (set(row) - _TRAJECTORY_FIELDS) | (set(sample) - _SAMPLE_FIELDS)
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            trajectories.append(Trajectory(sample=Sample(**sample), **row))
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise BadMessage(f"{where}: not a group of trajectories ({err}); a worker of another dockyard version?") from None
    return Group(prompt, trajectories)
