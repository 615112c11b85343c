"""The in-process driver with an event log and a router that can die and come back.

Every effect the flows emit is logged as the actors' links and the logger would record it (a
publication under its sender, a sent message of a logged kind under the sending link's name). While
the router is down, publications meant for it are lost (pub/sub), and what is sent to it waits in its
peers' queues, as a DEALER's queue holds messages for a ROUTER that is not there: once the
replacement binds, the instances' messages arrive in order, and the coordinator's are dropped by the
replacement's link because the log already gave them to it (``seen_event_ids``).
"""

from __future__ import annotations

from typing import Any

from bus.schema import Message
from psrl.config import Config
from psrl.flows.driver import InProcessRun
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.router import RouterFlow
from psrl.flows.router_recovery import COORDINATOR, ROUTER, rebuild_router
from psrl.staleness.types import LedgerSizes
from tests.flows.flow_helpers import LoggedEvents

TRAINER = "trainer-0"


class _DeadRouter:
    """Where the router's messages go while it is down: nowhere."""

    def handle(self, message: Message, now: float) -> list[Effect]:
        return []

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        return []


class _Backlog:
    """A busy actor's inbox: what reaches it waits, in order, until it gets to it."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def handle(self, message: Message, now: float) -> list[Effect]:
        self.messages.append(message)
        return []

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        return []


class RestartableRun(InProcessRun):
    def __init__(self, config: Config, **kwargs: Any) -> None:
        self.log = LoggedEvents()
        self.incarnations: dict[str, int] = {}
        self.held: list[tuple[str, Message]] = []  # sent to the router while it was down, in order
        self.router_down = False
        super().__init__(config, **kwargs)
        self.bus.tap = self._record

    def _record(self, sender: str, effect: Effect, now: float) -> None:
        incarnation = self.incarnations.get(sender, 0)
        if isinstance(effect, Publish):
            self.log.add(sender, effect.message, incarnation)
        elif isinstance(effect, Send):
            if effect.message.LOGGED:
                link = f"{ROUTER}.link" if sender == ROUTER else f"{sender}-{effect.to}.link"
                self.log.add(link, effect.message, incarnation)
            if self.router_down and effect.to == ROUTER:
                self.held.append((sender, effect.message))

    def kill_router(self) -> None:
        self.router_down = True
        self.bus.nodes[ROUTER] = _DeadRouter()
        self._timers = [t for t in self._timers if t[0] != ROUTER]

    def restart_router(self) -> RouterFlow:
        """The replacement rebuilds from the log, binds, and gets what its peers queued meanwhile."""
        self.incarnations[ROUTER] = self.incarnations.get(ROUTER, 0) + 1
        recovery = rebuild_router(self.log.events, LedgerSizes.from_config(self.config), launch=0)
        self.router = RouterFlow(self.config, recovery=recovery)
        self.bus.nodes[ROUTER] = self.router
        self.router_down = False
        self.bus.post(ROUTER, self.router.start(self.now), self.now)
        self._timers += [(ROUTER, timer, self.now + timer.interval_s) for timer in self.router.timers()]
        held, self.held = self.held, []
        for sender, message in held:
            if sender != COORDINATOR or not message.LOGGED:
                self.bus.post(ROUTER, self.router.handle(message, self.now), self.now)
        return self.router

    def stall_trainer(self) -> _Backlog:
        """The trainer falls behind (a long step): what reaches it waits, so the ledger runs ahead."""
        backlog = _Backlog()
        self.bus.nodes[TRAINER] = backlog
        return backlog

    def release_trainer(self) -> None:
        backlog = self.bus.nodes[TRAINER]
        assert isinstance(backlog, _Backlog)
        self.bus.nodes[TRAINER] = self.trainer
        for message in backlog.messages:
            self.bus.post(TRAINER, self.trainer.handle(message, self.now), self.now)

    def round(self) -> None:
        if not self.router_down:
            super().round()
            return
        # the dead router neither routes nor ticks; everything else goes on
        route, self.router.route = self.router.route, lambda now: []  # type: ignore[method-assign]
        try:
            super().round()
        finally:
            self.router.route = route  # type: ignore[method-assign]

    def rounds_until(self, done: Any, max_rounds: int) -> int:
        for count in range(max_rounds):
            if done():
                return count
            self.round()
        raise AssertionError(f"not reached in {max_rounds} rounds (at {self.now:.1f} s)")
