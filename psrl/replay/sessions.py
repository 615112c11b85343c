"""Checker for the session scheduler's ThunderAgent decisions (``psrl replay --check sessions``).

Every ``session.tick`` record holds the instances' KV capacity and the sessions (pin, status,
footprint, hang state) the tick saw; ``schedule_sessions`` is re-run on them under the run's
``session_strategy.thunder_agent`` settings (or the ``--what-if`` ones) and must hang and continue
the same sessions.
"""

from __future__ import annotations

from typing import Any

from bus.messages import SessionTick
from bus.schema import Event
from psrl.config import Config
from psrl.coordination.session import decode_session_tick, schedule_sessions
from psrl.replay.checker import Checker, register_checker

Decided = tuple[tuple[int, ...], tuple[int, ...]]


@register_checker
class SessionChecker(Checker):
    """Each session-scheduler tick's hang and continue decisions re-made from its recorded inputs."""

    name = "sessions"
    decisions = ("session.tick",)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.settings = config.psrl.rollout_coordination.session_strategy.thunder_agent

    def redecide(self, event: Event[Any]) -> Decided:
        log = decode_session_tick(event.message.record)
        decision = schedule_sessions(log.instances, log.sessions, self.settings)
        return tuple(int(s) for s in decision.hang), tuple(int(o.session_id) for o in decision.resume)

    def recorded(self, event: Event[SessionTick]) -> Decided:
        return tuple(event.message.hung), tuple(event.message.continued)
