"""Upgrade functions: read events written with an older schema version of their kind.

One function per (kind, old version) lifts an untyped event one version up: it receives the
envelope and message as decoded msgpack lists (structs are positional) and returns them in the
next version's layout. `upgrade` chains them up to the current version. Register a function the
same day a kind's schema version is raised, and note the change in docs/protocol.md.

No kind has an older schema version yet, so that table is empty. Kinds that left the protocol are
below: an old event of a renamed or split kind is read as the kind that replaced it (`RENAMED_KINDS`),
one of a removed kind is dropped with the reason (`REMOVED_KINDS`).
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


# ---------------------------------------------------------------------------- kinds that left the protocol


def _split_group_complete(envelope: list[Any], message: list[Any]) -> tuple[str, list[Any]]:
    """``group.complete`` (to 1.11) travelled both ways; its sender says which of the two kinds it was."""
    sender = str(envelope[2])
    if sender.startswith("router"):  # the router (or its link): enough children finished
        return "group.finished", message
    if sender.startswith("coordinator"):  # the coordinator (or its link): accepted, occupy
        return "group.accept", message[:2]
    raise DecodeError(
        DropReason.UNKNOWN_KIND,
        f"group.complete from {sender!r}: neither the router nor the coordinator, so it is neither "
        "group.finished nor group.accept (the kinds that replaced it in protocol 1.12)",
    )


RenameFn = Callable[[list[Any], list[Any]], tuple[str, list[Any]]]

RENAMED_KINDS: dict[str, RenameFn] = {
    "group.complete": _split_group_complete,
}
"""A kind that left the protocol for others -> function naming the kind an old event is now (given its
untyped envelope and message) and its message in that kind's layout, at schema version 1."""

REMOVED_KINDS: dict[str, str] = {
    "gen.chunk": "was removed in protocol 1.12: nothing sent it since 1.4 (instances stream gen.tokens) "
    "and it was never logged",
}
"""A kind that left the protocol with nothing in its place -> why (the text of the drop)."""
