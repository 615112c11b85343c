"""Decision checkers: replay recorded inputs through decision code and compare with the record.

A checker wraps one piece of decision logic (routing policy, sync strategy, staleness ledger,
...). It declares the kinds it reads (`inputs`) and the kinds that record its decisions
(`decisions`), both as kind prefixes as in subscriptions (``""`` = every kind). Replay walks the
log in order; for each decision event it first asks the checker what it would decide now, from
the state rebuilt from earlier events (`redecide`), and compares that with the recorded decision
(`recorded`); then, if the event is also an input, it feeds it to `observe`.

A checker is built from a `Config`: the run's own for the agreement check, and one with
``--what-if`` overrides applied to ask which decisions other settings would have changed.

Register a checker with `@register_checker` in its own module and add that module to
`CHECKER_MODULES`, so ``psrl replay`` finds it without importing every checker up front.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from bus.plain import same_value
from bus.schema import Event
from psrl.config import Config

CHECKER_MODULES: list[str] = [
    "psrl.replay.sequence",
    "psrl.replay.decisions",
    "psrl.replay.staleness",
    "psrl.replay.sessions",
    "psrl.replay.scaling",
]
"""Modules that register checkers; a missing module is skipped (its extra is not installed)."""

CHECKERS: dict[str, type[Checker]] = {}


@dataclass(frozen=True)
class NotJudged:
    """What `redecide` returns for a decision it cannot judge, and why (counted by reason in the report)."""

    reason: str


CANNOT_JUDGE = "the checker cannot judge it"  # a checker that answered None without a reason


class Checker(ABC):
    name: ClassVar[str]
    inputs: ClassVar[tuple[str, ...]] = ()
    decisions: ClassVar[tuple[str, ...]]

    def __init__(self, config: Config) -> None:
        self.config = config

    def observe(self, event: Event[Any]) -> None:  # noqa: B027 (a checker may need no state)
        """Update the rebuilt state with one recorded input."""

    @abstractmethod
    def redecide(self, event: Event[Any]) -> Any | None:
        """What the decision code decides in place of `event`'s decision; a `NotJudged` (or None) when
        it cannot judge it."""

    def recorded(self, event: Event[Any]) -> Any:
        """The recorded decision to compare with (by default the whole message)."""
        return event.message

    def agrees(self, recorded: Any, recomputed: Any) -> bool:
        return same_value(recorded, recomputed)

    @classmethod
    def is_input(cls, kind: str) -> bool:
        return any(kind.startswith(prefix) for prefix in cls.inputs)

    @classmethod
    def is_decision(cls, kind: str) -> bool:
        return any(kind.startswith(prefix) for prefix in cls.decisions)


C = TypeVar("C", bound=type[Checker])


def register_checker(cls: C) -> C:
    """Class decorator adding a checker to the registry under its `name`."""
    name = getattr(cls, "name", "")
    if not name:
        raise ValueError(f"{cls.__name__} needs a class attribute `name`")
    if not getattr(cls, "decisions", ()):
        raise ValueError(f"checker {name} declares no decision kinds")
    existing = CHECKERS.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"checker name {name!r} is taken by {existing.__module__}.{existing.__name__}")
    CHECKERS[name] = cls
    return cls


def available_checkers() -> dict[str, type[Checker]]:
    """Every registered checker, after importing the modules that register them."""
    for module in CHECKER_MODULES:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    return dict(sorted(CHECKERS.items()))
