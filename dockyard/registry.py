"""One registry for every named component a config can select.

Configs pick components by `name:` (never by import path), so a rename inside the package does
not break a user's YAML. Built-in components register themselves with `@register(kind, name)`;
user code does the same from a module listed under `imports:` in the config.

A name can also be *declared* before its implementation lands: it is then part of the catalog
(so configs that select it validate, and typos are still caught) but building it fails with a
message saying it is not available in this version.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from dockyard.errors import DockyardError

KINDS: dict[str, str] = {
    "advantage_estimator": "turns rewards (and logprobs) into per-token advantages",
    "loss": "policy-gradient loss functions",
    "kl_estimator": "per-token estimate of KL(pi || pi_ref) from samples of pi",
    "safeguard": "off-policy safeguards: reweight or mask tokens sampled by another policy",
    "reward_transform": "change trajectory rewards before advantages (scaling, shaping, penalties)",
    "group_filter": "drop prompt groups before they train",
    "reward": "score a finished trajectory",
    "environment": "step a trajectory (tool calls -> observations) and score it",
    "agent": "multi-turn agents that drive an environment",
    "data_pre_processor": "rewrite a raw dataset row before messages are built",
    "buffer_replay_strategy": "order in which buffered prompt groups are replayed",
    "logger": "metric backends",
    "generation_backend": "rollout engines that serve token-in/token-out generation",
    "policy_backend": "trainer backends that own the policy weights",
    "sandbox": "isolation for tool execution",
}

# Modules whose import registers the built-in components.
_BUILTIN_MODULES = (
    "dockyard.components.catalog",
    "dockyard.components.rewards",
    "dockyard.components.data_pre_processors",
    "dockyard.components.buffer_replay",
)

class UnknownComponentError(DockyardError, LookupError):
    pass


class ComponentUnavailableError(DockyardError, RuntimeError):
    pass


@dataclass
class Entry:
    kind: str
    name: str
    doc: str
    registered: Callable[..., Any] | None = None
    target: str | None = None  # "module:attribute", imported on first use (keeps `validate` light)

    @property
    def available(self) -> bool:
        return self.registered is not None or self.target is not None

    @property
    def factory(self) -> Callable[..., Any] | None:
        if self.registered is None and self.target is not None:
            module, _, attribute = self.target.partition(":")
            self.registered = getattr(importlib.import_module(module), attribute)
        return self.registered


_entries: dict[tuple[str, str], Entry] = {}
_builtins_loaded = False


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown component kind {kind!r}; kinds are: {', '.join(KINDS)}")


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""


def register(kind: str, name: str, doc: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: make `factory` selectable as `name:` for components of `kind`."""
    _check_kind(kind)

    def wrap(factory: Callable) -> Callable:
        key = (kind, name)
        existing = _entries.get(key)
        if existing is not None and existing.registered is not None and existing.registered is not factory:
            raise ValueError(f"{kind} {name!r} is registered twice")
        line = doc or _first_line(factory.__doc__) or (existing.doc if existing else "")
        _entries[key] = Entry(kind, name, line, factory)
        return factory

    return wrap


def declare(kind: str, name: str, doc: str, target: str | None = None) -> None:
    """Put `name` in the catalog: implemented by `target` ("module:attribute", imported when first
    built), or not implemented yet when `target` is None."""
    _check_kind(kind)
    _entries.setdefault((kind, name), Entry(kind, name, doc, target=target))


def load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        _builtins_loaded = True


def names(kind: str) -> list[str]:
    _check_kind(kind)
    load_builtins()
    return sorted(name for (k, name) in _entries if k == kind)


def entries(kind: str) -> list[Entry]:
    return [_entries[(kind, name)] for name in names(kind)]


def get(kind: str, name: str) -> Entry:
    _check_kind(kind)
    load_builtins()
    entry = _entries.get((kind, name))
    if entry is None:
        valid = ", ".join(names(kind)) or "(none registered)"
        raise UnknownComponentError(f"unknown {kind} {name!r}; registered: {valid}")
    return entry


def build(kind: str, name: str, /, **kwargs: Any) -> Any:
    entry = get(kind, name)
    if entry.factory is None:
        raise ComponentUnavailableError(
            f"{kind} {name!r} is in the catalog but not implemented in this version of dockyard"
        )
    return entry.factory(**kwargs)
