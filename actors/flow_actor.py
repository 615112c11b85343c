"""An actor that is a thin adapter around a flow (``psrl.flows``): decode, call the flow, perform.

The subclass names its flow class (``FLOW``); the flow's input table (``handlers()``, with the
kinds it learns from the bus in ``BUS_KINDS``) is the actor's: it subscribes to the bus kinds
from the start and reads the others from its links once ``attach`` has given it the flow. Every
message of those kinds goes to ``flow.handle(message, now)``, and the effects come back here: a
``Send`` goes out on the link to its peer (one the link cannot deliver goes back to
``flow.undeliverable``), a ``Publish`` on the bus. The flow's timers run from the actor's loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from actors.base import Actor, Inputs
from bus.eventlog.reader import EventLogReader
from bus.link import Link
from bus.retainer import first_envelope
from bus.schema import Event
from psrl.flows.base import Flow
from psrl.flows.effects import Effect, Publish, Send, Timer

LOG_WAIT_S = 60.0  # how long a restarted actor waits for the event log to pass its own start
LOG_POLL_S = 0.2
LINK_BURST = 4096  # messages a link reads before it acts on them


class FlowActor(Actor):
    FLOW: ClassVar[type[Flow]] = Flow
    flow: Flow

    def inputs(self) -> Inputs:
        return Inputs(bus=dict.fromkeys(self.FLOW.BUS_KINDS, self.to_flow))

    def attach(self, flow: Flow, *, serving: Link | None = None, peers: dict[str, Link] | None = None) -> None:
        """Drive ``flow``: its inputs arrive on ``serving`` (a ROUTER link peers connect to) and on
        the ``peers`` links (one DEALER link per peer it connects to); its timers start now."""
        if not isinstance(flow, self.FLOW):
            raise TypeError(f"{type(self).__name__} drives a {self.FLOW.__name__}, not a {type(flow).__name__}")
        self.flow = flow
        # a link kind the actor handles itself (its ``inputs``) stays with that handler, which passes it on
        self.add_link_kinds([k for k in flow.link_kinds if k.KIND not in self._link_kinds], self.to_flow)
        self.serving = serving
        self.peers = dict(peers or {})
        for link in [*([serving] if serving is not None else []), *self.peers.values()]:
            self.add_input(link.socket, lambda link=link: self._on_link(link))  # type: ignore[misc]
        for timer in flow.timers():
            self.every(timer.interval_s, lambda timer=timer: self._on_timer(timer))  # type: ignore[misc]

    def logged_events(self) -> Iterator[Event[Any]]:
        """The run's event log, for an actor restarted within its launch to rebuild its state from."""
        if self.boot.run_dir is None:
            raise RuntimeError(f"a restarted {self.ROLE} rebuilds from the event log: place it on the launcher host")
        self._wait_for_the_log(self.events_dir)
        return (logged.event for logged in EventLogReader(self.events_dir).events())

    @property
    def events_dir(self) -> Path:
        """The run's event log (on the launcher host: ``boot.run_dir`` is set there)."""
        return Path(str(self.boot.run_dir)) / "events"

    def _wait_for_the_log(self, events_dir: Path) -> None:
        """Until the log holds an event sent after now. The predecessor died before now, so all it
        sent is in the log by then, even when the logger was being replaced too (a restarted logger
        first writes what it missed, then live events)."""
        started_ns = time.time_ns()
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            record = EventLogReader(events_dir).last_record()
            envelope = first_envelope(list(record.frames)) if record is not None else None
            if envelope is not None and envelope.wall_ns >= started_ns:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the event log has not been written for {LOG_WAIT_S:.0f} s (is the logger down?): "
                    f"the {self.ROLE}'s state cannot be rebuilt from it"
                )
            time.sleep(LOG_POLL_S)

    def refuse_a_torn_log(self, num_missing: int) -> None:
        """Continuing from a log that lost events would continue from a wrong state: stop with the reason."""
        if num_missing:
            raise RuntimeError(
                f"the event log lost {num_missing} events of this launch (the logger died or dropped them): "
                f"the {self.ROLE}'s state cannot be rebuilt from it"
            )

    def dispatch(self, event: Event[Any]) -> None:
        """Messages a restarted actor already took from the event log (``already_handled``) are dropped
        when their link delivers them too (they were sent while it was down): each is handled once."""
        handled: set[str] = getattr(self, "already_handled", set())
        if event.envelope.event_id in handled:
            handled.discard(event.envelope.event_id)
            return
        super().dispatch(event)

    def to_flow(self, event: Event[Any]) -> None:
        self.perform(self.flow.handle(event.message, time.monotonic()))

    def _on_link(self, link: Link) -> None:
        # Read what is queued (up to a burst) before acting on any of it: a handler that works long (a
        # training step) would otherwise take one message per step from a socket that queues fairly
        # across peers, and a flood from one peer would sit in the queue; bounded, so it cannot starve.
        events: list[Event[Any]] = []
        for _ in range(LINK_BURST):
            received = link.recv()
            if received is None:
                break
            events.extend(received[1])
        for event in events:
            self.dispatch(event)

    def _on_timer(self, timer: Timer) -> None:
        self.perform(timer.callback(time.monotonic()))

    # ------------------------------------------------------------------ effects

    def perform(self, effects: Sequence[Effect]) -> None:
        index = 0
        while index < len(effects):
            effect = effects[index]
            if isinstance(effect, Send):
                run = _send_run(effects, index)
                self._send(run)
                index += len(run)
                continue
            if isinstance(effect, Publish):
                self.publisher.publish(
                    effect.message,
                    model_version=effect.model_version,
                    request_id=effect.request_id,
                    prompt_id=effect.prompt_id,
                )
            else:
                self.perform_other(effect)
            index += 1

    def perform_other(self, effect: Effect) -> None:
        """Effects particular to one actor (the trainer's weight push)."""
        raise TypeError(f"{type(self).__name__} cannot perform {type(effect).__name__}")

    def _send(self, run: list[Send]) -> None:
        """One send, or a run of plain sends of one kind to one peer as one ZeroMQ message."""
        first = run[0]
        link = self._link_for(first.to)
        if len(run) > 1:
            is_sent = link.send_many([s.message for s in run], self._peer_name(first.to))
        else:
            is_sent = (
                link.send(
                    first.message,
                    self._peer_name(first.to),
                    model_version=first.model_version,
                    request_id=first.request_id,
                    prompt_id=first.prompt_id,
                )
                is not None
            )
        if not is_sent:
            for send in run:
                self.perform(self.flow.undeliverable(send, time.monotonic()))

    def _link_for(self, peer: str) -> Link:
        link = self.peers.get(peer, self.serving)
        if link is None:
            raise KeyError(f"{self.name}: no link to {peer!r} (peers: {sorted(self.peers)})")
        return link

    def _peer_name(self, peer: str) -> str | None:
        """A serving link addresses its peer by name; a peer's own link needs no address."""
        return None if peer in self.peers else peer

    def drop_counts(self) -> dict[str, int]:
        counts = super().drop_counts()
        for link in [getattr(self, "serving", None), *getattr(self, "peers", {}).values()]:
            if link is not None:
                counts.update({f"{link.drops.receiver}:{r}": n for r, n in link.drops.as_dict().items() if n})
        return counts

    def teardown(self) -> None:
        for link in [getattr(self, "serving", None), *getattr(self, "peers", {}).values()]:
            if link is not None:
                link.close()


def _send_run(effects: Sequence[Effect], start: int) -> list[Send]:
    """``effects[start]`` (a Send) and the plain sends of the same kind to the same peer right after it:
    token chunks come in such runs and travel as one ZeroMQ message."""
    first = effects[start]
    if not isinstance(first, Send):
        raise TypeError("a send run starts with a Send")
    run = [first]
    if not _is_plain(first):
        return run
    for effect in effects[start + 1 :]:
        if not (
            isinstance(effect, Send)
            and _is_plain(effect)
            and effect.to == first.to
            and type(effect.message) is type(first.message)
        ):
            break
        run.append(effect)
    return run


def _is_plain(send: Send) -> bool:
    return send.model_version is None and send.request_id is None and send.prompt_id is None
