"""Base model for every configuration section: strict, documented, one source of defaults."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
