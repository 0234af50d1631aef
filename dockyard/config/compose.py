"""Finding config files and composing `defaults:` lists, Hydra style.

A config may start with a defaults list:

    defaults:
      - grpo_base                 # another config (same folder, then the search path), merged first
      - /generation: vllm         # group `generation`, option `vllm`: generation/vllm.yaml
      - override /generation: sglang   # replace a group choice made anywhere below
      - _self_                    # where this file's own keys go (last when not listed)

A group file is placed at its `# @package <dotted.path>` header (`_global_` = the root), or at
the group's own path when it has none. The search path is every `--config-dir` in order, then the
config family shipped inside the package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from dockyard.config.errors import ConfigError, Problem

_PACKAGE_HEADER = re.compile(r"^#\s*@package\s+(\S+)\s*$")


def packaged_config_dir() -> Path:
    return Path(str(resources.files("dockyard") / "configs"))


def search_path(config_dirs: list[str | Path] | tuple = ()) -> list[Path]:
    return [Path(d).expanduser() for d in config_dirs] + [packaged_config_dir()]


def find_config(ref: str | Path, dirs: list[Path]) -> Path:
    """A path that exists wins; otherwise `ref` (with or without .yaml) is looked up on the search path."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    candidates = [path] if path.suffix in (".yaml", ".yml") else [path.with_name(path.name + ".yaml"), path]
    for directory in dirs:
        for candidate in candidates:
            target = directory / candidate if not candidate.is_absolute() else candidate
            if target.is_file():
                return target
    looked = ", ".join(str(d) for d in dirs)
    raise ConfigError([Problem("", f"config file not found: {ref} (looked in the current folder and {looked})")])


def load_yaml(path: Path) -> DictConfig:
    """Read one YAML file; syntax errors name the file and the line."""
    try:
        node = OmegaConf.load(path)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = err.problem or "invalid YAML"
        if err.context and err.context_mark is not None:
            what += f" ({err.context} that starts at line {err.context_mark.line + 1})"
        raise ConfigError([Problem("", f"YAML syntax error at {where}: {what}")], path) from None
    except (yaml.YAMLError, OSError) as err:
        raise ConfigError([Problem("", f"cannot read {path}: {err}")], path) from None
    except Exception as err:  # OmegaConf rejects e.g. non-string keys
        raise ConfigError([Problem("", f"cannot load {path}: {err}")], path) from None
    if node is None or isinstance(node, ListConfig):
        raise ConfigError([Problem("", f"{path} must hold a mapping of config keys at the top level")], path)
    return node


def _package_of(path: Path) -> str | None:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.startswith("#"):
                break
            match = _PACKAGE_HEADER.match(line.strip())
            if match:
                return match.group(1)
    return None


@dataclass
class _Composer:
    dirs: list[Path]
    overrides: dict[str, str | None]
    used_overrides: set[str] = field(default_factory=set)
    stack: list[Path] = field(default_factory=list)

    def compose(self, path: Path) -> DictConfig:
        if path.resolve() in self.stack:
            chain = " -> ".join(p.name for p in self.stack + [path.resolve()])
            raise ConfigError([Problem("defaults", f"defaults cycle: {chain}")], path)
        self.stack.append(path.resolve())
        try:
            return self._compose(path)
        finally:
            self.stack.pop()

    def _compose(self, path: Path) -> DictConfig:
        own = load_yaml(path)
        defaults = own.pop("defaults", None) if "defaults" in own else None
        if defaults is None:
            return own
        if not isinstance(defaults, ListConfig):
            raise ConfigError([Problem("defaults", "must be a list")], path)
        entries = OmegaConf.to_container(defaults)
        # Overrides made closer to the primary config win over those made deeper in the tree.
        for entry in entries:
            if isinstance(entry, dict) and len(entry) == 1:
                key, value = next(iter(entry.items()))
                if key.startswith("override "):
                    self.overrides.setdefault(_group_name(key[len("override "):]), value)
        result = OmegaConf.create({})
        self_merged = False
        for index, entry in enumerate(entries):
            if entry == "_self_":
                result = OmegaConf.merge(result, own)
                self_merged = True
            elif isinstance(entry, str):
                result = OmegaConf.merge(result, self.compose(self._find_sibling(entry, path, index)))
            elif isinstance(entry, dict) and len(entry) == 1:
                key, value = next(iter(entry.items()))
                if key.startswith("override "):
                    continue
                group = _group_name(key)
                if group in self.overrides:
                    self.used_overrides.add(group)
                    value = self.overrides[group]
                if value is None:
                    continue
                result = OmegaConf.merge(result, self._group_node(group, str(value), path, index))
            else:
                raise ConfigError([Problem(f"defaults[{index}]", f"cannot read entry {entry!r}; use "
                                           "'name', 'group: option', 'override /group: option' or '_self_'")],
                                  path)
        if not self_merged:
            result = OmegaConf.merge(result, own)
        return result

    def _find_sibling(self, name: str, including: Path, index: int) -> Path:
        for directory in [including.parent, *self.dirs]:
            candidate = directory / f"{name.lstrip('/')}.yaml"
            if candidate.is_file():
                return candidate
        raise ConfigError([Problem(f"defaults[{index}]", f"config {name!r} not found next to {including} "
                                   f"or on the search path")], including)

    def _group_node(self, group: str, option: str, including: Path, index: int) -> DictConfig:
        for directory in self.dirs:
            candidate = directory / group / f"{option}.yaml"
            if candidate.is_file():
                node = self.compose(candidate)
                package = _package_of(candidate) or group.replace("/", ".")
                if package == "_global_":
                    return node
                for part in reversed(package.split(".")):
                    node = OmegaConf.create({part: node})
                return node
        available = sorted({p.stem for d in self.dirs if (d / group).is_dir() for p in (d / group).glob("*.yaml")})
        hint = f"; options: {', '.join(available)}" if available else f"; no group folder {group!r} found"
        raise ConfigError([Problem(f"defaults[{index}]", f"no option {option!r} in group {group!r}{hint}")],
                          including)


def _group_name(key: str) -> str:
    return key.strip().lstrip("/")


def groups(dirs: list[Path]) -> set[str]:
    """Top-level group folders on the search path (for `group=option` on the command line)."""
    return {child.name for d in dirs if d.is_dir() for child in d.iterdir()
            if child.is_dir() and any(child.glob("*.yaml"))}


def compose(path: Path, dirs: list[Path], group_overrides: dict[str, Any] | None = None) -> DictConfig:
    composer = _Composer(dirs, dict(group_overrides or {}))
    config = composer.compose(path)
    unused = sorted(set(composer.overrides) - composer.used_overrides)
    if unused:
        raise ConfigError([Problem(f"override /{group}", "this group is not selected in any defaults list, "
                                   "so there is nothing to override") for group in unused], path)
    return config
