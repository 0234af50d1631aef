"""YAML -> OmegaConf -> CLI overrides -> resolve ${...} -> pydantic MasterConfig -> constraints.

`load_config` is the only way a config enters dockyard; every entry point (run, submit, validate,
the jobs inside an allocation) goes through it, so a config that passes here passes everywhere.
"""

from __future__ import annotations

import re

import difflib
import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from dockyard import registry
from dockyard.config import constraints
from dockyard.config.compose import compose, find_config, groups, search_path
from dockyard.config.errors import ConfigError, Problem
from dockyard.config.fields import section_model
from dockyard.config.resolvers import register_omegaconf_resolvers
from dockyard.config.schema import MasterConfig


@dataclass
class LoadedConfig:
    config: MasterConfig
    source: Path
    resolved: dict[str, Any]
    advice: list[Problem] = field(default_factory=list)   # valid, but recommended against (constraints.ADVICE)

    def print_advice(self, file=None) -> None:
        for problem in self.advice:
            print(f"warning: {self.source}: {problem}", file=file or sys.stderr)

    def to_yaml(self) -> str:
        """The validated config in schema order, defaults filled in."""
        return OmegaConf.to_yaml(OmegaConf.create(self.config.model_dump(mode="json")))


def load_config(config: str | Path, overrides: Sequence[str] = (),
                config_dirs: Sequence[str | Path] = ()) -> LoadedConfig:
    """Load, override, resolve and validate one config; raise ConfigError listing every problem."""
    register_omegaconf_resolvers()
    dirs = search_path(list(config_dirs))
    source = find_config(config, dirs)
    parsed = _parse_overrides(overrides, source)
    group_choices, value_overrides = _split_group_choices(parsed, groups(dirs))
    tree = compose(source, dirs, group_choices)
    _fill_schema_defaults(tree)
    # Later stages still run after a bad override so the user sees every problem at once.
    problems = _apply_overrides(tree, value_overrides)
    unresolved = _unresolvable(tree)
    if unresolved:
        raise ConfigError(problems + unresolved, source)
    stray = _stray_top_level_keys(tree)
    container = OmegaConf.to_container(tree, resolve=True)
    _anchor_to_config_folder(container, source, {o.key_or_group for o in value_overrides})
    problems += _import_user_modules(container, source)
    master, schema_problems = _validate(container)
    problems += schema_problems
    if master is not None:
        problems += constraints.check(master)
    if problems:
        raise ConfigError(problems, source)
    return LoadedConfig(master, source, container, stray + constraints.advise(master))


CONFIG_RELATIVE_PATHS = ("policy.generation.chat_template.path",)


def _anchor_to_config_folder(container: dict, source: Path, overridden: set[str]) -> None:
    """Relative file paths the schema documents as the config's own resolve against the config file's
    folder, so a config works from any working folder (and in the job, which reads the resolved file); one
    given as a command-line override resolves against the working folder, like a shell path."""
    for dotted in CONFIG_RELATIVE_PATHS:
        *parents, leaf = dotted.split(".")
        node = container
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get(leaf), str) or Path(node[leaf]).is_absolute():
            continue
        base = Path.cwd() if dotted in overridden else Path(source).resolve().parent
        node[leaf] = str(base / node[leaf])


def _stray_top_level_keys(tree: DictConfig) -> list[Problem]:
    """Top-level keys beside the schema are allowed as variables for `${...}` (models_dir, data_dir);
    a section (a mapping) that nothing refers to is most likely a misspelt one (`grpoo:`), which would
    otherwise pass unseen."""
    raw = OmegaConf.to_yaml(tree, resolve=False)
    return [Problem(key, "is not a section of the schema and no ${...} refers to it; a misspelt section? "
                    f"(it is ignored{_did_you_mean(str(key))})")
            for key in tree.keys() if key not in MasterConfig.model_fields
            and isinstance(tree._get_node(key), DictConfig)
            and not re.search(r"\$\{\s*" + re.escape(str(key)) + r"\b", raw)]


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key, list(MasterConfig.model_fields), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# --- overrides -------------------------------------------------------------------------------

def _parse_overrides(overrides: Sequence[str], source: Path) -> list:
    parser = OverridesParser.create()
    parsed, problems = [], []
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except HydraException as err:
            problems.append(Problem(f"override {text!r}", f"cannot parse: {err} (quote a value that holds "
                                    "spaces, commas or a ${resolver:args}: key='...')"))
            continue
        if override.is_sweep_override():
            problems.append(Problem(f"override {text!r}", "sweeps (a=1,2) are not supported; give one value "
                                    "(quote a string that contains commas)"))
        elif override.package is not None:
            problems.append(Problem(f"override {text!r}", "package overrides (key@pkg=v) are not supported"))
        else:
            parsed.append(override)
    if problems:
        raise ConfigError(problems, source)
    return parsed


def _split_group_choices(parsed: list, group_names: set[str]) -> tuple[dict[str, Any], list]:
    """`generation=sglang` picks an option of a config group; everything else sets a value."""
    choices, values = {}, []
    for override in parsed:
        key = override.key_or_group
        if (override.type.name == "CHANGE" and "." not in key and key in group_names
                and key not in MasterConfig.model_fields):
            choices[key] = override.value()
        else:
            values.append(override)
    return choices, values


def _node(tree: DictConfig, key: str):
    node: Any = tree
    for part in key.split("."):
        if isinstance(node, DictConfig):
            node = node._get_node(part, validate_access=False)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        else:
            return None
        if node is None:
            return None
    return node


def _suggest(tree: DictConfig, key: str) -> str:
    parent_key, _, leaf = key.rpartition(".")
    parent = _node(tree, parent_key) if parent_key else tree
    if isinstance(parent, DictConfig):
        close = difflib.get_close_matches(leaf, [str(k) for k in parent.keys()], n=1)
        if close:
            return f" (did you mean '{parent_key + '.' if parent_key else ''}{close[0]}'?)"
    return ""


def _apply_overrides(tree: DictConfig, parsed: list) -> list[Problem]:
    problems = []
    OmegaConf.set_struct(tree, True)
    for override in parsed:
        key, text = override.key_or_group, override.input_line
        exists = _node(tree, key) is not None
        try:
            if override.is_delete():
                if not exists:
                    problems.append(Problem(key, f"cannot delete ('{text}'): the key is not in the config"))
                    continue
                parent_key, _, leaf = key.rpartition(".")
                parent = _node(tree, parent_key) if parent_key else tree
                with open_dict(parent):
                    del parent[int(leaf) if isinstance(parent, ListConfig) else leaf]
            elif override.is_add():
                if exists:
                    problems.append(Problem(key, f"'{text}' adds a key that already exists; "
                                            f"set it with '{text[1:]}' (or force with '+{text}')"))
                    continue
                with open_dict(tree):
                    OmegaConf.update(tree, key, override.value(), merge=True, force_add=True)
            elif override.is_force_add():
                with open_dict(tree):
                    OmegaConf.update(tree, key, override.value(), merge=True, force_add=True)
            else:
                if not exists:
                    problems.append(Problem(key, f"'{text}' sets a key that is not in the config"
                                            f"{_suggest(tree, key)}; to add a new key use '+{text}'"))
                    continue
                # `key=value` replaces: a dict value is the new mapping, not merged into the old one.
                OmegaConf.update(tree, key, override.value(), merge=False)
        except (OmegaConfBaseException, HydraException, ValueError) as err:
            problems.append(Problem(key, f"cannot apply '{text}': {err}"))
    OmegaConf.set_struct(tree, False)
    return problems


# --- schema defaults -------------------------------------------------------------------------

def _defaults_into(model: type[BaseModel], node: DictConfig) -> None:
    """Give `node` every key of `model` it lacks (required ones as ???), so overrides can set
    schema fields the YAML omitted without '+', and --show prints the whole config."""
    for name, info in model.model_fields.items():
        child = node._get_node(name)
        sub, is_list = section_model(info.annotation)
        if child is None:
            if info.is_required():
                node[name] = "???"
            elif sub is not None and not is_list and info.default_factory is not None:
                node[name] = {}
                _defaults_into(sub, node[name])
            else:
                node[name] = info.get_default(call_default_factory=True)
        elif sub is not None and not child._is_interpolation() and not child._is_missing():
            if is_list and isinstance(child, ListConfig):
                for item in child:
                    if isinstance(item, DictConfig):
                        _defaults_into(sub, item)
            elif isinstance(child, DictConfig):
                _defaults_into(sub, child)


def _fill_schema_defaults(tree: DictConfig) -> None:
    for name, info in MasterConfig.model_fields.items():
        child = tree._get_node(name)
        sub, _ = section_model(info.annotation)
        if sub is not None and isinstance(child, DictConfig) and not child._is_interpolation():
            _defaults_into(sub, child)
        elif child is None and sub is None and not info.is_required():
            tree[name] = info.get_default(call_default_factory=True)  # so `imports=[mod]` needs no '+' 


# --- resolution ------------------------------------------------------------------------------

def _unresolvable(tree: DictConfig) -> list[Problem]:
    """Every unset ??? value and every ${...} that cannot be resolved, with its dotted path."""
    problems: list[Problem] = []

    def walk(node, path: str) -> None:
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            child = node._get_node(key)
            where = (f"{path}.{key}" if path else str(key)) if isinstance(node, DictConfig) else f"{path}[{key}]"
            if child is None:
                continue
            if child._is_missing():
                problems.append(Problem(where, "missing value (???): set it in the config or with "
                                        f"'{where}=<value>'"))
            elif child._is_interpolation():
                try:
                    node[key]
                except OmegaConfBaseException as err:
                    reason = str(err).split("\n")[0]
                    problems.append(Problem(where, f"cannot resolve {child._value()!r}: {reason}"))
            elif isinstance(child, (DictConfig, ListConfig)) and child._value() is not None:
                walk(child, where)

    walk(tree, "")
    return problems


def _import_user_modules(container: dict[str, Any], source: Path) -> list[Problem]:
    # User component modules usually live next to the config or in the working folder.
    return import_user_modules(container.get("imports") or [], [str(source.parent.resolve()), str(Path.cwd())])


def import_user_modules(modules: Any, folders: list[str]) -> list[Problem]:
    """Import the config's `imports:` (searching `folders` too), so their @register components exist."""
    if not isinstance(modules, list):
        return [Problem("imports", f"must be a list of module names, got {modules!r}")]
    registry.load_builtins()
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)
    problems = []
    for index, module in enumerate(modules):
        try:
            importlib.import_module(str(module))
        except Exception as err:
            problems.append(Problem(f"imports[{index}]", f"cannot import module {module!r}: "
                                    f"{type(err).__name__}: {err}"))
    return problems


def read_resolved(path: str | Path) -> MasterConfig:
    """A resolved config written by `dockyard run` / `dockyard-submit`, read in a process they started:
    its `imports:` first (found via DOCKYARD_IMPORT_PATH), so user components validate."""
    import yaml

    raw = yaml.safe_load(Path(path).read_text())
    folders = [f for f in os.environ.get("DOCKYARD_IMPORT_PATH", "").split(os.pathsep) if f]
    problems = import_user_modules(raw.get("imports") or [], folders)
    if problems:
        raise ConfigError(problems, source=str(path))
    return MasterConfig.model_validate(raw)


def import_folders(source: Path) -> str:
    """DOCKYARD_IMPORT_PATH for the processes a run starts: where `imports:` modules are found."""
    return os.pathsep.join([str(source.parent.resolve()), str(Path.cwd())])


# --- pydantic --------------------------------------------------------------------------------

def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part).startswith("function-"):
            continue  # pydantic's union / validator markers are not config keys
        else:
            out += f".{part}" if out else str(part)
    return out


def _keys_at(container: Any, loc: tuple) -> list[str]:
    node = container
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return []
    return [str(k) for k in node] if isinstance(node, dict) else []


def _schema_problem(error: dict, container: dict) -> Problem:
    loc = tuple(p for p in error["loc"] if isinstance(p, int) or not ("[" in p or p.startswith("function-")))
    path = _dotted(loc)
    kind = error["type"]
    if kind == "missing":
        what = "required section is missing" if len(loc) == 1 else "required value is missing"
        return Problem(path, what)
    if kind == "extra_forbidden":
        parent = loc[:-1]
        siblings = [k for k in _keys_at(container, parent) if k != loc[-1]]
        close = difflib.get_close_matches(str(loc[-1]), siblings, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return Problem(path, f"unknown key{hint}; see docs/config-reference.md for the keys of "
                       f"'{_dotted(parent) or 'the top level'}'")
    message = error["msg"]
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        message = "expected a section (a mapping of keys)"
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if "input" in error and not isinstance(error["input"], (dict, list)):
        message += f" (got {error['input']!r})"
    return Problem(path, message)


def _validate(container: dict[str, Any]) -> tuple[MasterConfig | None, list[Problem]]:
    try:
        return MasterConfig.model_validate(container), []
    except ValidationError as err:
        return None, [_schema_problem(e, container) for e in err.errors()]
