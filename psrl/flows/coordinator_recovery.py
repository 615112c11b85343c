"""What a restarted coordinator rebuilds from the run's event log: its own flow, re-run on what it was told.

The coordinator's state (the prompt cursor, the open groups with their results and rewards, what
each buffer has handed to the trainer, the chunks not yet trained) is a function of the messages
it handled: the router's on its link (trajectories, group outcomes, occupancy, full buffers,
refills), which the log holds in the order the router sent them, and the versions the parameter
server published and the trainer reached. Prompts, sampling and rewards are functions of the ids
and tokens, so a fresh flow fed those messages in log order, from the launch's start, reaches the
state its predecessor had (``replay_coordinator``). What it did along the way is then set against
what the dead coordinator is logged as having done:

* requests, group verdicts (``GroupAccept``, ``GroupDrop``), ``Consume`` and ``TrainBatch`` it
  already sent are not sent again; those it never got to send (it died first) are sent now;
* a request or group verdict or ``Consume`` it is logged as sending that the router is logged
  nowhere as having is sent again: a killed process loses the sends still queued in its socket,
  though its link logged them. A request counts as had when any router event names it (a queued
  one has none yet); a command when the router logged something while handling it (it handles
  commands at once, each with a ledger record). The router takes each of these once in a launch
  (``psrl.flows.once_each``), so a copy of one it already has is dropped;
* every chunk of a buffer the trainer has not reached yet is handed to the trainer ranks again
  (a rank skips the chunks it already has), since chunk traffic is not logged;
* metrics, sync ticks and sync or migration commands are not repeated: the new incarnation decides afresh.

Only this launch counts (a resumed run's coordinator starts from its checkpoint's cursor). A log
with gaps in that launch (the logger lost events) cannot be re-run: ``num_missing_events`` says so
and the actor refuses to start rather than continue from a wrong state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bus.gaps import GapTracker
from bus.messages import (
    GenerateRequest,
    RunFinished,
    ScaleDecided,
    TrainBatch,
    TrainData,
    TrainerProgress,
    WeightsPublished,
)
from bus.schema import Event
from psrl.flows.coordinator import CoordinatorFlow
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.once_each import once_key
from psrl.flows.router_recovery import COORDINATOR, ROUTER, actor_of
from psrl.launches import launch_of

# bus events the coordinator's book, buffers and instance view depend on (ScaleDecided: retired instances)
FACTS = (WeightsPublished, TrainerProgress, ScaleDecided)


@dataclass
class LoggedOutputs:
    """What the dead coordinator is logged as having sent, and what of it the router is logged as having."""

    sent: dict[tuple[type, int], str] = field(default_factory=dict)  # a once-each message -> its event id
    router_requests: set[int] = field(default_factory=set)  # requests some event of the router names
    router_parents: set[str] = field(default_factory=set)  # coordinator messages the router logged something for
    batches: set[int] = field(default_factory=set)
    has_finished: bool = False

    def note(self, message: Any, event_id: str) -> None:
        key = once_key(message)
        if key is not None:
            self.sent[(type(message), key)] = event_id
        elif isinstance(message, TrainBatch):
            self.batches.add(message.buffer)
        elif isinstance(message, RunFinished):
            self.has_finished = True

    def note_router(self, event: Event[Any]) -> None:
        """A router event: the request it names, and the coordinator message it was logged handling."""
        request_id = getattr(event.message, "request_id", None)
        if isinstance(request_id, int):
            self.router_requests.add(request_id)
        if event.envelope.parent is not None:
            self.router_parents.add(event.envelope.parent)

    def is_new(self, effect: Effect) -> bool:
        """Whether ``effect`` (from the re-run) still has to happen: never sent, or sent and the router
        is logged nowhere as having it (it may have died in the dead process's socket)."""
        message = effect.message if isinstance(effect, Send | Publish) else None
        key = once_key(message)
        if key is not None:
            event_id = self.sent.get((type(message), key))
            if event_id is None:
                return True
            if isinstance(message, GenerateRequest):  # a queued request has no router event yet
                return message.request_id not in self.router_requests
            return event_id not in self.router_parents  # a command is handled (and logged) at once
        if isinstance(message, TrainBatch):
            return message.buffer not in self.batches
        if isinstance(message, RunFinished):
            return not self.has_finished
        return False  # chunks are handed over again below; metrics, ticks and commands are not repeated


@dataclass
class CoordinatorRecovery:
    effects: list[Effect]  # what is left to do, in order
    seen_event_ids: set[str]  # the router's messages the re-run handled (a later delivery is a duplicate)
    num_inputs: int = 0
    num_resent_chunks: int = 0
    num_missing_events: int = 0  # sequence gaps in the launch's log: events the logger never got


def replay_coordinator(
    flow: CoordinatorFlow, events: Iterable[Event[Any]], launch: int, now: float
) -> CoordinatorRecovery:
    """Re-run ``flow`` (fresh, built as its predecessor was) on the launch's logged inputs."""
    inputs: list[Any] = []
    outputs = LoggedOutputs()
    seen: set[str] = set()
    gaps = GapTracker()
    for event in events:
        env, message = event.envelope, event.message
        if launch_of(env.incarnation) != launch:
            continue
        gaps.observe(env)
        actor = actor_of(env.sender)
        if actor == ROUTER:
            outputs.note_router(event)
        if actor == ROUTER and env.sender.endswith(".link") and type(message) in flow.link_kinds:
            inputs.append(message)
            seen.add(env.event_id)
        elif isinstance(message, FACTS):
            inputs.append(message)
        elif actor == COORDINATOR:
            outputs.note(message, env.event_id)
    effects = flow.start(now)
    for message in inputs:
        effects += flow.handle(message, now)
    left = [e for e in effects if outputs.is_new(e)]
    chunks = _chunks_to_hand_over(flow)
    return CoordinatorRecovery(left + chunks, seen, len(inputs), len(chunks), gaps.num_missing)


def _chunks_to_hand_over(flow: CoordinatorFlow) -> list[Effect]:
    """Every chunk of a buffer the trainer has not reported trained, to every rank, in buffer order."""
    return [
        Send(trainer, data, model_version=buffer)
        for buffer in sorted(flow.unacknowledged)
        for data in flow.unacknowledged[buffer]
        for trainer in flow.trainers
        if isinstance(data, TrainData)
    ]
