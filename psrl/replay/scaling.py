"""Checker for elastic rollout decisions (``psrl replay --check scale``).

Every ``sup.scale`` answer to a request records the request (role, change or count), the instances
running before, the placement's room and the next free index; ``decide_scale`` is re-run on them
and must add, remove or refuse (with the same reason) exactly as recorded. Not judged: an instance
lost for good (an empty token: no request) and a refusal for the run's state (stopping, colocated),
which the decision never saw.
"""

from __future__ import annotations

from typing import Any

from bus.messages import ScaleDecided
from bus.schema import Event
from psrl.coordination.scaling import RUN_STATE_REFUSAL, ScaleAsk, decide_scale
from psrl.replay.checker import Checker, NotJudged, register_checker

Decided = tuple[tuple[str, ...], tuple[str, ...], str]
LOST = "an instance lost for good (topology.restart_rollout=false), not a request"


@register_checker
class ScaleChecker(Checker):
    """Each scale request's added and removed instances, or its refusal, re-made from its recorded inputs."""

    name = "scale"
    decisions = (ScaleDecided.KIND,)

    def redecide(self, event: Event[Any]) -> Decided | NotJudged:
        decided: ScaleDecided = event.message
        if not decided.token:
            return NotJudged(LOST)
        if decided.error.startswith(RUN_STATE_REFUSAL):
            return NotJudged("refused for the run's state, not by the decision")
        ask = ScaleAsk(decided.role, decided.delta, decided.target)
        plan = decide_scale(ask, decided.before, decided.limit, decided.next_index)
        return plan.added, plan.removed, plan.error

    def recorded(self, event: Event[ScaleDecided]) -> Decided:
        decided = event.message
        return tuple(decided.added), tuple(decided.removed), decided.error
