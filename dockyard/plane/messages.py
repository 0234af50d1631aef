"""What crosses the broker, as JSON (never pickle: whoever can write to the broker must not be able to
run code in the trainer): a prompt task for the workers, a finished group for the trainer."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, fields

from dockyard.data.datasets import Prompt
from dockyard.errors import ComponentError
from dockyard.loop.rollouts import Group, Trajectory
from dockyard.policy.samples import Sample


class BadMessage(ComponentError):
    label = "data plane"


def sampling_settings(cfg) -> dict:
    """What decides how a prompt is sampled and scored, by dotted path: a worker whose config differs
    from the trainer's here would make other groups than the ones the run means to train on."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        else:
            flat[prefix] = value

    walk("policy.generation", cfg.policy.generation.model_dump(mode="json"))
    walk("env", cfg.env.model_dump(mode="json"))
    flat.update({"policy.max_total_sequence_length": cfg.policy.max_total_sequence_length,
                 "policy.tokenizer_name": cfg.policy.tokenizer_name,
                 "grpo.num_generations_per_prompt": cfg.grpo.num_generations_per_prompt,
                 "data.add_system_prompt": cfg.data.add_system_prompt})
    return flat


def settings_differences(run: dict, here: dict) -> list[str]:
    return [f"{path} (the run: {run.get(path)!r}, here: {here.get(path)!r})"
            for path in sorted(set(run) | set(here)) if run.get(path) != here.get(path)]


def encode_prompt(prompt: Prompt) -> str:
    try:
        return json.dumps(asdict(prompt))
    except TypeError as err:
        raise BadMessage(f"dataset {prompt.source!r}: a row cannot be sent to the rollout workers as JSON ({err})") from None


def decode_prompt(text: str) -> Prompt:
    return Prompt(**json.loads(text))


_TRAJECTORY_FIELDS = {f.name for f in fields(Trajectory)} - {"sample"}
_SAMPLE_FIELDS = {f.name for f in fields(Sample)}


def _sample_fields(sample: Sample) -> dict:
    row = asdict(sample)
    if row["images"] is not None:   # PNG bytes travel as base64 text
        row["images"] = [base64.b64encode(image).decode("ascii") for image in row["images"]]
    return row


def encode_trajectories(group: Group) -> str:
    """The group's trajectories (its prompt stays behind: the trainer has the row)."""
    return json.dumps([{**{k: v for k, v in asdict(t).items() if k != "sample"}, "sample": _sample_fields(t.sample)}
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
            if sample.get("images") is not None:
                sample["images"] = [base64.b64decode(image, validate=True) for image in sample["images"]]
            trajectories.append(Trajectory(sample=Sample(**sample), **row))
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as err:
        raise BadMessage(f"{where}: not a group of trajectories ({err}); a worker of another dockyard version?") from None
    return Group(prompt, trajectories)
