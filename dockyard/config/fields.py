"""Building blocks shared by the schema sections: the base model, documented fields, and the
type of a field that names a registered component."""

from __future__ import annotations

from dataclasses import dataclass
import typing
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from dockyard import registry


class Section(BaseModel):
    """A config section with a fixed set of keys: a misspelt key is an error, not ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class OpenSection(BaseModel):
    """A section that also carries keys beyond the documented ones (forwarded to a subsystem)."""

    model_config = ConfigDict(extra="allow", validate_default=True)


def field(default: Any = ..., doc: str = "", rule: str = "", **kwargs: Any) -> Any:
    """A documented field. `rule` is the constraint text shown in docs/config-reference.md."""
    extra = {"rule": rule} if rule else None
    if isinstance(default, type) and issubclass(default, BaseModel):
        return Field(default_factory=default, description=doc, json_schema_extra=extra, **kwargs)
    return Field(default, description=doc, json_schema_extra=extra, **kwargs)


@dataclass(frozen=True)
class ComponentKind:
    """Marks a str field as the name of a registered component of `kind`."""

    kind: str

    def check(self, value: str | None) -> str | None:
        if value is not None and value not in registry.names(self.kind):
            valid = ", ".join(registry.names(self.kind))
            raise ValueError(f"unknown {self.kind} {value!r}; registered names: {valid}")
        return value


def component(kind: str) -> Any:
    marker = ComponentKind(kind)
    return Annotated[str, marker, AfterValidator(marker.check)]


def section_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model a field holds (directly, as Optional, or as list elements) and whether it is a list."""
    origin = typing.get_origin(annotation)
    if origin is list:
        args = typing.get_args(annotation)
        model, _ = section_model(args[0]) if args else (None, False)
        return model, True
    if origin is typing.Union or str(origin) == "types.UnionType":
        for arg in typing.get_args(annotation):
            model, is_list = section_model(arg)
            if model is not None:
                return model, is_list
        return None, False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def is_open(model: type[BaseModel]) -> bool:
    return model.model_config.get("extra") == "allow"


def changed_fields(section: BaseModel) -> list[str]:
    """The names of `section`'s fields set away from their defaults (a setting the running code would
    not read is refused by these names)."""
    return [name for name, spec in type(section).model_fields.items()
            if getattr(section, name) != spec.get_default(call_default_factory=True)]
