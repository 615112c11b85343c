"""throughput_optimal and throughput_optimal_with_budget: route by marginal decode throughput.

For a request of ``r`` context tokens and an instance with ``n`` in-flight requests over ``K``
KV tokens, the gain is ``T(n + 1, K + r) - T(n, K)`` with ``T`` the cost model's throughput.
Groups are tried best first; within a group the largest gain wins if it reaches
``delta_throughput_threshold * T(1, r)`` (the throughput of the request alone). An instance is
skipped when its engine has waiting requests or the request would not fit its KV capacity.
If no group has a qualifying instance the request stays queued: adding it anywhere would buy
less throughput than waiting for a better moment.

The budget variant charges the request ``prompt + budgeted response`` tokens and reads each
instance's budget-rounded token load (see ``psrl.routing.budget``), so long expected responses
weigh in before they are generated.
"""

from __future__ import annotations

from psrl.engine_cost.model import CostModel
from psrl.routing.budget import budget_request_tokens
from psrl.routing.decision import DecisionInputs, Reason
from psrl.routing.instance import CandidateState
from psrl.routing.policies.base import Choice, Groups

# Per candidate, the request-independent parts of its gain:
# (candidate, room for new tokens (-1 = cannot start now), n + 1, step time of n + 1 before the
# request's own tokens, current throughput). gain(r) = (n + 1) / (step + k1 * r) - current.
_Terms = tuple[CandidateState, float, int, float, float]
_MEMO_LIMIT = 4096


class ThroughputOptimalPolicy:
    uses_prefix_tree = False
    uses_offload_tier = False
    kv_admission_limit: float | None = None
    overload_limit: float | None = None

    def __init__(self, cost_model: CostModel, delta_threshold: float, request_budget: int | None = None) -> None:
        self.cost_model = cost_model
        self.delta_threshold = delta_threshold
        self.request_budget = request_budget
        self.name = "throughput_optimal" if request_budget is None else "throughput_optimal_with_budget"
        # Memo of _terms by candidate identity: a candidate is immutable and most do not change
        # between two decisions. It only caches; results do not depend on it.
        self._memo: dict[int, _Terms] = {}

    def request_tokens(self, inputs: DecisionInputs) -> int:
        req = inputs.request
        if self.request_budget is None:
            return max(1, req.num_tokens)
        return budget_request_tokens(req.num_prompt_tokens, req.num_response_tokens, self.request_budget)

    def choose(self, inputs: DecisionInputs, groups: Groups) -> Choice | str:
        tokens = self.request_tokens(inputs)
        threshold = self.delta_threshold * self.cost_model.throughput(1, tokens)
        for group_index, group in enumerate(groups):
            best = self._best_gain(inputs, group, tokens)
            if best is not None and best[1] >= threshold:
                return Choice(best[0], group_index, best[1], "max_gain")
        return Reason.NO_GAIN

    def _best_gain(self, inputs: DecisionInputs, group: list[int], tokens: int) -> tuple[int, float] | None:
        cands, memo, k1_r = inputs.candidates, self._memo, self.cost_model.k1 * tokens
        best_index, best_gain = -1, 0.0
        for index in group:
            cand = cands[index]
            terms = memo.get(id(cand))
            if terms is None or terms[0] is not cand:
                terms = self._terms(cand)
            if terms[1] < tokens:
                continue  # waiting engine queue, or the request does not fit its KV
            gain = terms[2] / (terms[3] + k1_r) - terms[4]
            if best_index < 0 or gain > best_gain:
                best_index, best_gain = index, gain
        return (best_index, best_gain) if best_index >= 0 else None

    def _terms(self, cand: CandidateState) -> _Terms:
        model = self.cost_model
        kv = cand.budget_kv_tokens if self.request_budget is not None else cand.kv_tokens
        if cand.num_waiting > 0:
            room = -1.0
        elif cand.kv_capacity_tokens > 0:
            room = float(cand.kv_capacity_tokens - kv)
        else:
            room = float("inf")
        n_after = cand.num_inflight + 1
        step_after = model.k1 * kv + max(model.k2, model.k3 * n_after) + model.k4
        terms = (cand, room, n_after, step_after, model.throughput(cand.num_inflight, kv))
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[id(cand)] = terms
        return terms
