"""Which config fields the code reads, by dotted path: the evidence behind "no silent settings".

With DOCKYARD_FIELD_READS=<folder> set (the test suite sets it for itself and every process it
starts), every process records each schema field it reads as an attribute (`cfg.cluster.teacher.
tasks_per_node`) by its dotted path, one line per new path in <folder>/reads-<pid>.txt. Only reads
by the package's code count, not by the config package itself (loading, constraints, the reference:
checking a value is not acting on it) nor by a test. tests/conftest.py compares the union with the
schema after a whole suite.

Off (the default) nothing is patched and reading costs nothing extra.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel

ENV = "DOCKYARD_FIELD_READS"
_CONFIG_PACKAGE = str(Path(__file__).resolve().parent) + os.sep
_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep
_paths: dict[int, tuple[BaseModel, str]] = {}   # id(section) -> (section, "its.dotted.path.")
_seen: set[str] = set()


def schema_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field of the schema by dotted path (list elements share their list's path)."""
    from dockyard.config.fields import section_model

    for name, spec in model.model_fields.items():
        yield f"{prefix}{name}"
        sub, _ = section_model(spec.annotation)
        if sub is not None:
            yield from schema_paths(sub, f"{prefix}{name}.")


def label(config: BaseModel, prefix: str = "") -> None:
    """Give each section of a validated config its dotted path (lists: every element the list's)."""
    _paths[id(config)] = (config, prefix)
    for name in type(config).model_fields:
        value = config.__dict__.get(name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                label(item, f"{prefix}{name}.")


def _record(path: str) -> None:
    if path in _seen:
        return
    _seen.add(path)
    folder = os.environ.get(ENV)
    if folder:
        with open(Path(folder) / f"reads-{os.getpid()}.txt", "a", encoding="utf-8") as out:
            out.write(path + "\n")


def install(classes: list[type[BaseModel]], master: type[BaseModel]) -> None:
    """Record reads of the fields of `classes`; label every `master` once it is validated."""
    def getattribute(self, name):
        value = object.__getattribute__(self, name)
        if name[:1] != "_" and name in type(self).model_fields:
            entry = _paths.get(id(self))
            if entry is not None and entry[0] is self:
                caller = sys._getframe(1).f_code.co_filename
                if caller.startswith(_PACKAGE) and not caller.startswith(_CONFIG_PACKAGE):
                    _record(entry[1] + name)
        return value

    for cls in classes:
        cls.__getattribute__ = getattribute
    original = master.model_post_init

    def post_init(self, context) -> None:
        original(self, context)
        label(self)

    master.model_post_init = post_init
    master.__pydantic_post_init__ = "model_post_init"
    master.model_rebuild(force=True)   # pydantic fixes the post-init call when it builds the validator


def read_paths(folder: str | Path) -> set[str]:
    return {line.strip() for file in Path(folder).glob("reads-*.txt") for line in file.read_text().splitlines()
            if line.strip()}
