"""Actor.dispatch: a failing handler is counted and logged, unless it is marked fatal."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TypeVar

import pytest

from actors.base import Actor, Inputs
from bus.messages import Metrics, TrainData
from bus.stamp import Cause
from psrl.log import get_logger


class _Actor(Actor):
    ROLE = "test"

    def inputs(self) -> Inputs:
        return Inputs(link={TrainData: self._on_data}, bus={Metrics: self._on_metrics}, fatal=frozenset({TrainData}))

    def _on_metrics(self, event: object) -> None:
        raise ValueError("a bad metrics event")

    def _on_data(self, event: object) -> None:
        raise RuntimeError("the step failed")


ActorT = TypeVar("ActorT", bound=Actor)


def _bare_actor(cls: type[ActorT] = _Actor) -> ActorT:  # type: ignore[assignment]
    # the dispatch path only: no sockets, no boot
    actor = object.__new__(cls)
    actor.log = get_logger("test")
    actor.num_unhandled = actor.num_handler_errors = 0
    actor.cause = Cause()
    actor._handlers = actor._handler_table()
    return actor


def _event(kind: str) -> SimpleNamespace:
    return SimpleNamespace(envelope=SimpleNamespace(kind=kind, sender="someone", event_id="someone#0:7"), message=None)


def test_what_a_handler_sends_names_the_event_being_handled_as_its_parent() -> None:
    actor = _bare_actor()
    seen: list[str | None] = []
    actor._handlers[Metrics.KIND] = lambda event: seen.append(actor.cause.event_id)
    actor.dispatch(_event(Metrics.KIND))
    assert seen == ["someone#0:7"] and actor.cause.event_id is None  # only while it is handled


def test_a_failing_handler_is_counted_and_the_actor_keeps_serving() -> None:
    actor = _bare_actor()
    actor.dispatch(_event(Metrics.KIND))
    actor.dispatch(_event(Metrics.KIND))
    assert actor.num_handler_errors == 2


def test_a_failing_fatal_handler_ends_the_actor() -> None:
    actor = _bare_actor()
    with pytest.raises(RuntimeError, match="the step failed"):
        actor.dispatch(_event(TrainData.KIND))
    assert actor.num_handler_errors == 0


def test_the_trainer_marks_its_training_handler_fatal() -> None:
    from actors.trainer import TrainerActor

    actor = object.__new__(TrainerActor)
    actor._handler_table()
    assert TrainData.KIND in actor._fatal_kinds
    assert TrainData.KIND in actor._link_kinds


@pytest.mark.parametrize("role", ["coordinator", "router", "rollout", "trainer", "session"])
def test_a_flow_actor_subscribes_to_every_bus_kind_its_flow_handles(role: str) -> None:
    """An actor that overrides ``inputs`` must still subscribe to its flow's bus kinds (a trainer that
    did not never received colocation's pause command, and the switch waited forever)."""
    from actors.flow_actor import FlowActor
    from actors.registry import actor_class

    cls = actor_class(role)
    assert issubclass(cls, FlowActor)
    subscribed = set(object.__new__(cls).inputs().bus)
    missing = set(cls.FLOW.BUS_KINDS) - subscribed
    assert not missing, f"{role} does not subscribe to {sorted(k.__name__ for k in missing)}"


def test_the_trainers_own_handler_keeps_the_training_data_its_flow_also_takes() -> None:
    """Attaching the flow must not take over a link kind the actor handles itself: the trainer's handler waits
    for its warm-up before the flow trains (when the flow took the data directly, the two ran at once)."""
    from actors.trainer import TrainerActor
    from psrl.flows.trainer import TrainerFlow

    actor = _bare_actor(TrainerActor)
    flow = object.__new__(TrainerFlow)
    flow._handlers = flow.handlers()
    actor.add_input = lambda *_: None  # type: ignore[method-assign]
    actor.every = lambda *_: None  # type: ignore[method-assign]
    actor.attach(flow)
    assert actor._handlers[TrainData.KIND] == actor._on_train_data
    assert TrainData in flow.link_kinds
