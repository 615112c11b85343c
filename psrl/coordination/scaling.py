"""Elastic rollout: which instances a scale request adds or removes, or why it is refused (pure).

A request names the role and either a change (``rollout=+2``, ``rollout=-1``) or a count
(``rollout=3``). It is decided against the instances running now, the most the placement has room
for and the index the next new instance takes (an index is never reused within a launch, so every
instance name means one thing in the event log). New instances take the next indices; removals take
the newest instances first (capacity added last is the first given back, as borrowed capacity is).
A refused request changes nothing. The supervisor logs every decision with these inputs
(``sup.scale``) and ``psrl replay --check scale`` re-makes it from them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

SCALABLE_ROLES = ("rollout",)
NO_TARGET = -1  # ScaleRequest.target when the request gives a change instead
RUN_STATE_REFUSAL = "the run cannot scale now: "  # a refusal for the run's state, made before any decision
_SPEC = re.compile(r"^(?P<role>[a-z_]+)=(?P<sign>[+-]?)(?P<count>\d+)$")


class ScaleSpecError(ValueError):
    """A scale argument that is not ``ROLE=+N``, ``ROLE=-N`` or ``ROLE=N``."""


@dataclass(frozen=True)
class ScaleAsk:
    """What a request asks for: a change (``delta``) or a count (``target``, NO_TARGET: none)."""

    role: str
    delta: int = 0
    target: int = NO_TARGET

    def describe(self) -> str:
        if self.target != NO_TARGET:
            return f"{self.role}={self.target}"
        return f"{self.role}={self.delta:+d}"


@dataclass(frozen=True)
class ScalePlan:
    """The decision: instances to start and to drain, or why nothing changes (``error``)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    error: str = ""

    @property
    def is_refused(self) -> bool:
        return bool(self.error)


def parse_scale_spec(text: str) -> ScaleAsk:
    """``rollout=+2`` / ``rollout=-1`` / ``rollout=3`` as typed on the command line."""
    match = _SPEC.match(text.strip())
    if match is None:
        raise ScaleSpecError(
            f"scale argument {text!r}: want ROLE=+N (add N), ROLE=-N (remove N) or ROLE=N (run N), e.g. rollout=+2"
        )
    role, sign, count = match["role"], match["sign"], int(match["count"])
    if role not in SCALABLE_ROLES:
        raise ScaleSpecError(
            f"scale argument {text!r}: role {role!r} cannot be scaled (scalable: {', '.join(SCALABLE_ROLES)})"
        )
    if not sign:
        return ScaleAsk(role, target=count)
    if count == 0:
        raise ScaleSpecError(f"scale argument {text!r}: a change of 0 changes nothing; give +N or -N with N >= 1")
    return ScaleAsk(role, delta=count if sign == "+" else -count)


def instance_name(role: str, index: int) -> str:
    return f"{role}-{index}"


def instance_index(name: str) -> int:
    """The index in ``rollout-3`` (-1 for a name without one)."""
    _, _, tail = name.rpartition("-")
    return int(tail) if tail.isdigit() else -1


def decide_scale(ask: ScaleAsk, before: Sequence[str], limit: int, next_index: int) -> ScalePlan:
    """The instances ``ask`` adds or removes given the running ones (``before``), the placement's room
    (``limit`` instances in all) and the next free index; a refusal names the problem and the fix."""
    if ask.role not in SCALABLE_ROLES:
        return ScalePlan(error=f"role {ask.role!r} cannot be scaled (scalable: {', '.join(SCALABLE_ROLES)})")
    count = len(before)
    want = ask.target if ask.target != NO_TARGET else count + ask.delta
    if ask.target == NO_TARGET and ask.delta == 0:
        return ScalePlan(error=f"{ask.describe()} changes nothing; give +N, -N or a count")
    if want < 1:
        fix = (
            f"remove at most {count - 1} ({ask.role}=-{count - 1}, or {ask.role}=1)"
            if count > 1
            else f"nothing can be removed; add one first ({ask.role}=+1)"
        )
        return ScalePlan(
            error=f"{ask.describe()} would leave {want} of the {count} {ask.role} instances; a run needs at least "
            f"one: {fix}"
        )
    if want > limit:
        return ScalePlan(
            error=f"{ask.describe()} would run {want} {ask.role} instances, but the placement has room for {limit}: "
            f"ask for at most {ask.role}={limit}, or give the run more room (topology.max_rollout_instances at "
            "launch, more rollout_gpus, or another host)"
        )
    if want >= count:
        return ScalePlan(added=tuple(instance_name(ask.role, next_index + k) for k in range(want - count)))
    newest_first = sorted(before, key=lambda name: (instance_index(name), name), reverse=True)
    return ScalePlan(removed=tuple(sorted(newest_first[: count - want], key=instance_index)))


def scale_limit(configured: int, num_gpus: int, num_cores: int, num_started: int) -> int:
    """How many instances the launching host has room for: ``topology.max_rollout_instances`` when set,
    else one per listed rollout GPU, else one per CPU core; never fewer than the run started with."""
    if configured > 0:
        room = configured
    elif num_gpus > 0:
        room = num_gpus
    else:
        room = num_cores
    return max(room, num_started)
