"""Role name -> actor class, loaded lazily so an actor process imports only what it runs."""

from __future__ import annotations

import importlib

ACTOR_CLASSES: dict[str, str] = {
    "logger": "actors.logger:LoggerActor",
    "coordinator": "actors.coordinator:CoordinatorActor",
    "router": "actors.router:RouterActor",
    "rollout": "actors.rollout:RolloutActor",
    "trainer": "actors.trainer:TrainerActor",
    "ps": "actors.ps:ParameterShardActor",
    "session": "actors.session:SessionActor",
}


def actor_class(role: str) -> type:
    """The class of ``role``; roles may also be given as ``module:Class`` (test actors)."""
    target = ACTOR_CLASSES.get(role, role)
    if ":" not in target:
        raise KeyError(f"unknown actor role {role!r} (known: {', '.join(ACTOR_CLASSES)})")
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not isinstance(cls, type):
        raise TypeError(f"{target} is not a class")
    return cls
