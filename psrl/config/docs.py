"""Generate docs/configuration.md from the schema (the schema is the only source)."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from psrl.config import keys
from psrl.config.root import Config

HEADER = """# Configuration reference

Generated from the schema by `psrl config docs`; do not edit by hand.

Compose a configuration from a preset and dotted overrides, exactly as written here:

    psrl config show demo psrl.staleness=2 psrl.rollout_coordination.partial_rollout.enable=True

Unknown keys are refused with a suggestion, and every cross-field rule is checked before
anything starts (all problems are reported at once).
"""


class UndocumentedFieldError(ValueError):
    """A schema field lacks its one-line description."""


def type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" if a is not None else "null" for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        named = " \\| ".join(type_name(a) for a in args if a is not type(None))
        return named + " \\| null" if type(None) in args else named
    if origin is tuple:
        return "tuple[" + ", ".join(type_name(a) for a in get_args(annotation)) + "]"
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=False)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value}`"


def section_tables(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    subsections: list[str] = []
    for name, info in model.model_fields.items():
        if not info.description:
            raise UndocumentedFieldError(f"{prefix}{name} has no description")
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            subsections += section_tables(sub, f"{prefix}{name}.")
        else:
            desc = info.description.replace("|", "\\|")
            rows.append(f"| `{prefix}{name}` | {type_name(sub)} | {default_text(info)} | {desc} |")
    out: list[str] = []
    if rows:
        title = prefix.rstrip(".") or "root"
        doc = (model.__doc__ or "").strip().splitlines()
        out += [f"## `{title}`", ""]
        if doc and model is not Config:
            out += [doc[0], ""]
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |", *rows, ""]
    return out + subsections


def key_tables() -> list[str]:
    out = ["## Other spellings", "", "Accepted aliases (veRL-style trees used in upstream documents):", ""]
    out += [f"- `{old}` -> `{new}`" for old, new in keys.ALIASES.items()]
    out += ["", "Moved keys (refused, with the new path in the message):", ""]
    out += [f"- `{old}` -> `{new}`" for old, new in keys.MOVED.items()]
    out += ["", "Upstream keys that do not apply to psrl (refused with the reason):", ""]
    out += [f"- `{old}`: {why}" for old, why in keys.NOT_APPLICABLE.items()]
    return [*out, ""]


def render() -> str:
    body = []
    for name, info in Config.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            body += section_tables(sub, f"{name}.")
    return HEADER + "\n" + "\n".join(body + key_tables())
