"""Which config fields the code reads, by dotted path: the evidence behind "no silent settings".

With DOCKYARD_FIELD_READS=<folder> set (the test suite sets it for itself and every process it
starts), every process records each schema field it reads as an attribute (`cfg.cluster.teacher.
tasks_per_node`) by its dotted path, one line per new path in <folder>/reads-<pid>.txt. Only reads
by the package's code count, not by the config package's checking (loading, constraints, the
reference: checking a value is not acting on it) nor by a test. tests/conftest.py compares the union with the
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
_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep
# the config package's own checking (loading, constraints, the reference) reads values without acting on
# them; its topology and job plan are readers like any other code
_NOT_READERS = tuple(str(Path(__file__).resolve().parent / name) for name in (
    "loader.py", "constraints" + os.sep, "reference.py", "compose.py", "fields.py", "field_reads.py"))
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


def section_paths(model: type[BaseModel], prefix: str = "", found: dict | None = None) -> dict[type, set[str]]:
    """Each section class of the schema -> the dotted prefixes it sits at ("env.sandbox." ...)."""
    from dockyard.config.fields import section_model

    found = {} if found is None else found
    for name, spec in model.model_fields.items():
        sub, _ = section_model(spec.annotation)
        if sub is not None:
            found.setdefault(sub, set()).add(f"{prefix}{name}.")
            section_paths(sub, f"{prefix}{name}.", found)
    return found


def _subclasses(cls: type) -> list[type]:
    return [cls] + [deeper for sub in cls.__subclasses__() for deeper in _subclasses(sub)]


def install(bases: list[type[BaseModel]], master: type[BaseModel]) -> None:
    """Record reads of the fields of every subclass of `bases`. A validated `master` labels each of
    its sections with its path; a section built on its own (a test's SandboxConfig(...)) takes the one
    path its class sits at, if it sits at only one."""
    unique = {cls: next(iter(paths)) for cls, paths in section_paths(master).items() if len(paths) == 1}

    def getattribute(self, name):
        value = object.__getattribute__(self, name)
        if name[:1] != "_" and name in type(self).model_fields:
            entry = _paths.get(id(self))
            if entry is not None and entry[0] is self:
                caller = sys._getframe(1).f_code.co_filename
                if caller.startswith(_PACKAGE) and not caller.startswith(_NOT_READERS):
                    _record(entry[1] + name)
        return value

    def labelled(cls: type[BaseModel], label_self) -> None:
        original = cls.model_post_init

        def post_init(self, context) -> None:
            original(self, context)
            label_self(self)

        cls.model_post_init = post_init
        cls.__pydantic_post_init__ = "model_post_init"
        cls.model_rebuild(force=True)   # pydantic fixes the post-init call when it builds the validator

    classes = [cls for base in bases for cls in _subclasses(base) if cls is not master]
    for cls in classes:
        cls.__getattribute__ = getattribute
        if cls in unique:
            labelled(cls, lambda self, path=unique[cls]: _paths.setdefault(id(self), (self, path)))
    master.__getattribute__ = getattribute
    labelled(master, label)


def read_paths(folder: str | Path) -> set[str]:
    return {line.strip() for file in Path(folder).glob("reads-*.txt") for line in file.read_text().splitlines()
            if line.strip()}
