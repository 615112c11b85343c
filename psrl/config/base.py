"""Base model for every configuration section: strict, documented, one source of defaults."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


class Section(BaseModel):
    """A configuration section.

    Unknown keys are refused, and every field must carry a one-line description
    (checked by the docs generator and its test).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def field(default: Any, description: str, **kwargs: Any) -> Any:
    """A documented field with a default (the only place a default is written)."""
    return Field(default=default, description=description, **kwargs)


def section(factory: type[Section], description: str) -> Any:
    """A nested section created from its own defaults."""
    return Field(default_factory=factory, description=description)


def _yaml_switch(value: Any) -> Any:
    """YAML 1.1 reads a bare on/off as a bool (in files and in key=value overrides); read it back as the word."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return value


# a three-way switch; `key=on` and `key: off` mean the words, not YAML booleans
Switch = Annotated[Literal["auto", "on", "off"], BeforeValidator(_yaml_switch)]
