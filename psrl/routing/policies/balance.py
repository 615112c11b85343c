"""Load-balancing policies without a model: random, round_robin and request_num_balance.

These consider every admitted candidate; the priority order only breaks ties (only
throughput_optimal walks the groups in order, since only it can refuse a whole group).
"""

from __future__ import annotations

from psrl.routing.decision import DecisionInputs
from psrl.routing.instance import CandidateState
from psrl.routing.policies.base import Choice, Groups, flatten, least_loaded

_MASK64 = (1 << 64) - 1


def mix64(seed: int, index: int) -> int:
    """SplitMix64 of (seed, index): a reproducible uniform draw per decision, no hidden RNG state."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class RandomPolicy:
    """Uniform over admitted candidates; draw ``i`` of a decision depends only on (seed, decision seq)."""

    name = "random"
    uses_prefix_tree = False
    uses_offload_tier = False
    kv_admission_limit: float | None = None
    overload_limit: float | None = None

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def choose(self, inputs: DecisionInputs, groups: Groups) -> Choice | str:
        flat = flatten(groups)
        group, index = flat[mix64(self.seed, inputs.seq) % len(flat)]
        return Choice(index, group, 0.0, "random")


class RoundRobinPolicy:
    """The next admitted instance after the cursor in the router's instance order."""

    name = "round_robin"
    uses_prefix_tree = False
    uses_offload_tier = False
    kv_admission_limit: float | None = None
    overload_limit: float | None = None

    def choose(self, inputs: DecisionInputs, groups: Groups) -> Choice | str:
        cands, cursor = inputs.candidates, inputs.rr_cursor
        # Groups list candidates in instance order: the next in turn is the first at or after the
        # cursor, wrapping around to the first overall.
        after = [
            (cands[g[k]].order, gi, g[k]) for gi, g in enumerate(groups) if (k := _first_at(cands, g, cursor)) >= 0
        ]
        if after:
            _, group, index = min(after)
        else:
            _, group, index = min((cands[g[0]].order, gi, g[0]) for gi, g in enumerate(groups))
        return Choice(index, group, float(cands[index].order), "next_in_turn")


def _first_at(cands: tuple[CandidateState, ...], group: list[int], cursor: int) -> int:
    """Position in ``group`` of its first candidate whose order is >= cursor, or -1."""
    for position, index in enumerate(group):
        if cands[index].order >= cursor:
            return position
    return -1


class RequestNumBalancePolicy:
    """Fewest in-flight requests routed there (the router's exact count)."""

    name = "request_num_balance"
    uses_prefix_tree = False
    uses_offload_tier = False
    kv_admission_limit: float | None = None
    overload_limit: float | None = None

    def choose(self, inputs: DecisionInputs, groups: Groups) -> Choice | str:
        return least_loaded(inputs, groups)
