"""Renders docs/config-reference.md from the schema and the constraints package, so the reference
cannot drift from the code (tests/config/test_reference.py compares the committed file with this)."""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from typing import Any, Iterator

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dockyard.config import constraints
from dockyard.config.fields import ComponentKind, is_open, section_model
from dockyard.config.schema import MasterConfig

HEADER = """# Config reference

Generated from the schema by `python tools/gen_config_reference.py`; do not edit by hand
(a test fails when this file and the schema disagree).

A run is one YAML file plus Hydra overrides, loaded as
YAML -> OmegaConf -> overrides -> `${...}` resolution -> pydantic `MasterConfig` -> cross-field
constraints (see the README's "Configs" section for the override grammar and `defaults:` lists).

- `???` marks a value with no default: set it in the config or on the command line.
- Sections marked *open* also accept keys beyond the listed ones; those are forwarded to the
  subsystem (an engine, an environment, a component constructor). Every other section rejects
  unknown keys, naming the closest valid one.
- `MasterConfig` itself is open: extra top-level keys (for example `models_dir` used in
  interpolations) are kept.
- Component names (`name:`, `backend:`, `type:` ...) must be registered; `dockyard list` prints them.
"""


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "`???`"
    if info.default_factory is not None:
        value = info.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value if not isinstance(value, tuple) else list(value))}`"


_BOUNDS = {annotated_types.Gt: "> {gt}", annotated_types.Ge: ">= {ge}", annotated_types.Lt: "< {lt}",
           annotated_types.Le: "<= {le}", annotated_types.MinLen: "at least {min_length} item(s)"}


def _metadata(annotation: Any) -> Iterator[Any]:
    """Annotated metadata of a type and of the types inside it (Optional[PositiveInt] and such)."""
    yield from getattr(annotation, "__metadata__", ())
    for arg in typing.get_args(annotation):
        yield from _metadata(arg)


def _type_notes(annotation: Any, metadata: list) -> list[str]:
    notes = []
    for arg in [annotation, *typing.get_args(annotation)]:
        if typing.get_origin(arg) is typing.Literal:
            notes.append("one of " + " / ".join(f"`{v}`" for v in typing.get_args(arg)))
    for meta in [*metadata, *_metadata(annotation)]:
        if isinstance(meta, ComponentKind):
            notes.append(f"a registered {meta.kind} (`dockyard list {meta.kind}`)")
        for kind, text in _BOUNDS.items():
            if isinstance(meta, kind):
                notes.append(text.format(**{f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}))
    return list(dict.fromkeys(notes))


def _rows(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, type[BaseModel] | None, FieldInfo]]:
    for name, info in model.model_fields.items():
        sub, is_list = section_model(info.annotation)
        path = f"{prefix}.{name}" if prefix else name
        yield path, sub, info
        if sub is not None:
            yield from _rows(sub, f"{path}[]" if is_list else path)


def field_paths() -> list[str]:
    """Every documented dotted path (list elements written as `[]`)."""
    return [path for path, _, _ in _rows(MasterConfig, "")]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    out = [HEADER, "## Top level\n", "| Field | Default | Description | Constraints |", "|---|---|---|---|"]
    sections = []
    for name, info in MasterConfig.model_fields.items():
        sub, _ = section_model(info.annotation)
        if sub is None:
            out.append(_row(name, info))
        else:
            out.append(_row(name, info, f"see [{name}](#{name})"))
            sections.append((name, sub, info))
    for name, model, info in sections:
        open_note = " (*open*)" if is_open(model) else ""
        out += ["", f"## {name}", "", f"{info.description}{open_note}", "",
                "| Field | Default | Description | Constraints |", "|---|---|---|---|"]
        for path, sub, field_info in _rows(model, name):
            extra = ""
            if sub is not None and is_open(sub):
                extra = "*open* section"
            out.append(_row(path, field_info, extra))
    out += ["", "## Cross-field constraints", "",
            "Checked after the schema, all at once; each problem names the field to change.", ""]
    section = None
    for rule in constraints.RULES:
        module = sys.modules[rule.__module__]
        if module is not section:   # one heading per module of config/constraints/, the section it checks
            section = module
            title = " ".join((module.__doc__ or "").split())
            out += ([""] if out[-1] else []) + [f"**{title}** (`{rule.__module__.replace('.', '/')}.py`)", ""]
        out.append(f"- **{rule.__name__}**: {' '.join((rule.__doc__ or '').split())}")
    out += ["", "## Advice", "", "Valid, but recommended against: printed as a warning by `dockyard validate`, "
            "`dockyard run` and `dockyard-submit`, never refused.", ""]
    for rule in constraints.ADVICE:
        out.append(f"- **{rule.__name__}**: {(rule.__doc__ or '').strip()}")
    return "\n".join(out) + "\n"


def _row(path: str, info: FieldInfo, extra: str = "") -> str:
    rule = (info.json_schema_extra or {}).get("rule", "") if isinstance(info.json_schema_extra, dict) else ""
    notes = _type_notes(info.annotation, list(info.metadata))
    constraints_text = "; ".join(part for part in [*notes, rule, extra] if part) or "—"
    return f"| `{path}` | {_cell(_default(info))} | {_cell(info.description or '')} | {_cell(constraints_text)} |"
