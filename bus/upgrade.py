"""Upgrade functions: read events written with an older schema version of their kind.

One function per (kind, old version) lifts an untyped event one version up: it receives the
envelope and message as decoded msgpack lists (structs are positional) and returns them in the
next version's layout. `upgrade` chains them up to the current version. Register a function the
same day a kind's schema version is raised, and note the change in docs/protocol.md.

Protocol 1.0 is the first protocol, so no kind has an older version yet and the table is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bus.errors import DecodeError, DropReason

UpgradeFn = Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]]

UPGRADES: dict[tuple[str, int], UpgradeFn] = {}
"""(kind, old schema version) -> function lifting (envelope, message) to version old + 1."""


def register_upgrade(kind: str, old_version: int) -> Callable[[UpgradeFn], UpgradeFn]:
    """Decorator: ``@register_upgrade("gen.request", 1)`` on a function lifting v1 to v2."""

    def register(fn: UpgradeFn) -> UpgradeFn:
        key = (kind, old_version)
        if key in UPGRADES:
            raise ValueError(f"an upgrade of {kind} from version {old_version} is already registered")
        UPGRADES[key] = fn
        return fn

    return register


def upgrade(
    kind: str, from_version: int, to_version: int, envelope: list[Any], message: list[Any]
) -> tuple[list[Any], list[Any]]:
    """Lift an untyped event from `from_version` to `to_version`, one registered step at a time."""
    version = from_version
    while version < to_version:
        step = UPGRADES.get((kind, version))
        if step is None:
            raise DecodeError(
                DropReason.UNSUPPORTED_VERSION,
                f"{kind} schema version {version} has no upgrade function to {version + 1}",
            )
        envelope, message = step(list(envelope), list(message))
        version += 1
    envelope = list(envelope)
    envelope[1] = to_version
    return envelope, message
