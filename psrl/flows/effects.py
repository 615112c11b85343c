"""What a flow asks its driver to do: the only way a flow reaches the world outside its own state.

A flow handles one decoded message at a time, at a time it is given, and returns effects; whoever
drives it (an actor, the in-process driver, the simulator, a unit test) performs them in order:

    Send(to, message)         deliver on the point-to-point link to peer ``to``
    Publish(message)          publish on the bus: every subscriber of the kind, and the event log
    PushWeights(version, ..)  hand the trainer's new weights to the parameter server (trainer only)

A ``Send`` its driver cannot deliver (the peer is gone) goes back to the flow through
``Flow.undeliverable``. Periodic work is declared by ``Flow.timers``: each ``Timer`` runs its
callback every ``interval_s`` with the current time and returns more effects.

Adding an effect is one frozen dataclass here, one entry in ``Effect``, and one case in each
driver's perform (``actors.base.FlowActor``, ``psrl.flows.local``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bus.schema import Message


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver ``message`` to peer ``to`` (an actor name) on its link."""

    to: str
    message: Message
    model_version: int | None = None
    request_id: int | None = None
    prompt_id: int | None = None


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``message`` on the bus."""

    message: Message
    model_version: int | None = None
    request_id: int | None = None
    prompt_id: int | None = None


@dataclass(frozen=True, slots=True)
class PushWeights:
    """The trainer finished step ``step`` and holds ``version``: push it, then report the step done.

    ``num_samples`` trajectories trained the step, which began at ``started_s`` (the driver's clock).
    """

    version: int
    step: int
    num_samples: int
    started_s: float


Effect = Send | Publish | PushWeights


@dataclass(frozen=True, slots=True)
class Timer:
    """Run ``callback(now)`` about every ``interval_s`` seconds; it returns effects to perform."""

    name: str
    interval_s: float
    callback: Callable[[float], list[Effect]]


Handler = Callable[[Any, float], None]
