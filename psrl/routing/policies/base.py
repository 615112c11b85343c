"""The interface every routing policy implements.

A policy ranks the candidates that survived worker selection. It receives the decision's
inputs and the admitted candidates as priority groups (lists of indices into
``inputs.candidates``, best group first) and returns a ``Choice`` or the reason it chose none.
Policies keep no state of their own: everything they read is in ``DecisionInputs``, which is
what makes a recorded decision replayable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from psrl.routing.decision import DecisionInputs

Groups = list[list[int]]


@dataclass(frozen=True, slots=True)
class Choice:
    index: int  # into DecisionInputs.candidates
    group: int  # priority group it came from
    score: float
    detail: str


class RoutingPolicy(Protocol):
    name: str
    uses_prefix_tree: bool  # needs gpu_match_tokens / tree_tokens in the inputs
    uses_offload_tier: bool  # needs offload_match_tokens
    # Policy-specific admission, applied with the common gate (None: no such limit):
    kv_admission_limit: float | None  # admit if kv_tokens + request tokens <= limit x KV capacity
    overload_limit: float | None  # admit if kv_tokens < limit x KV capacity

    def choose(self, inputs: DecisionInputs, groups: Groups) -> Choice | str:
        """Pick a candidate, or return a ``Reason`` for leaving the request queued."""
        ...


def flatten(groups: Groups) -> list[tuple[int, int]]:
    """(group, candidate index) pairs in priority order."""
    return [(g, i) for g, group in enumerate(groups) for i in group]


def least_loaded(inputs: DecisionInputs, groups: Groups, *, count_resting: bool = False) -> Choice:
    """Fewest in-flight requests (plus resting sessions with ``count_resting``); ties go to the better
    priority group, then instance order."""
    loads = [c.num_sessions if count_resting else c.num_inflight for c in inputs.candidates]
    best: tuple[int, int, int] | None = None  # (load, group, index)
    for group_index, group in enumerate(groups):
        index = min(group, key=loads.__getitem__)  # first minimum: lowest instance order
        load = loads[index]
        if best is None or load < best[0]:
            best = (load, group_index, index)
    if best is None:
        raise ValueError("least_loaded needs at least one candidate")
    return Choice(best[2], best[1], float(best[0]), "least_load")
