"""cache_aware and cache_aware_v1: prefer the instance that already holds the request's prefix.

Both read per-candidate prefix matches from the router's token radix tree (what was routed to
each instance since its KV cache was last cleared).

* Balance first: when loads are imbalanced (``max - min > balance_abs_threshold`` and
  ``max > balance_rel_threshold * min`` in-flight requests) or some instance's KV usage reaches
  ``balance_token_usage_threshold`` (< 1), route to the least loaded instance.
* ``cache_aware``: the best prefix match wins if its match ratio exceeds ``cache_threshold``;
  otherwise the instance with the smallest tree (most room to cache something new).
* ``cache_aware_v1``: score = ``gpu_overlap_weight * gpu_blocks + lmcache_overlap_weight *
  offload_blocks`` in whole KV blocks, where offload blocks are those the offloaded tier holds
  beyond the GPU match. Ties go to the lower load, then the smaller tree. With no qualifying
  hit it falls back to the least loaded instance. It also refuses an instance whose KV would
  exceed ``kv_capacity_threshold`` x its capacity with this request.

An instance whose KV usage reaches ``overload_token_usage_threshold`` (< 1) is not admitted.
"""

from __future__ import annotations

from psrl.config.coordination import CacheAwarePolicy as CacheAwareSettings
from psrl.routing.decision import DecisionInputs
from psrl.routing.policies.base import Choice, Groups, flatten, least_loaded


class CacheAwareRoutingPolicy:
    uses_prefix_tree = True

    def __init__(self, settings: CacheAwareSettings, *, multi_tier: bool) -> None:
        self.settings = settings
        self.multi_tier = multi_tier
        self.uses_offload_tier = multi_tier
        self.name = "cache_aware_v1" if multi_tier else "cache_aware"

    def admit(self, inputs: DecisionInputs, indices: list[int]) -> list[int]:
        cands, s = inputs.candidates, self.settings
        overload = s.overload_token_usage_threshold
        if overload < 1.0:  # usage = kv_tokens / capacity, for a known capacity
            indices = [i for i in indices if not cands[i].kv_tokens >= overload * cands[i].kv_capacity_tokens > 0]
        if self.multi_tier:
            limit, tokens = s.kv_capacity_threshold, inputs.request.num_tokens
            indices = [
                i
                for i in indices
                if cands[i].kv_capacity_tokens <= 0
                or cands[i].kv_tokens + tokens <= limit * cands[i].kv_capacity_tokens
            ]
        return indices

    def choose(self, inputs: DecisionInputs, groups: Groups) -> Choice | str:
        if self._is_imbalanced(inputs, groups):
            choice = least_loaded(inputs, groups)
            return Choice(choice.index, choice.group, choice.score, "shortest_queue")
        scores = self._scores(inputs, groups)  # only candidates with some overlap
        if scores:
            best_score = max(scores.values())
            group, index = _break_tie(inputs, [gi for gi, score in scores.items() if score == best_score])
            instance_id = inputs.candidates[index].instance_id
            if best_score > 0 and self._hit_ratio(inputs, instance_id) > self.settings.cache_threshold:
                return Choice(index, group, best_score, "cache_hit")
        if self.multi_tier:
            choice = least_loaded(inputs, groups)
            return Choice(choice.index, choice.group, 0.0, "least_load")
        return self._smallest_tree(inputs, flatten(groups))

    def _scores(self, inputs: DecisionInputs, groups: Groups) -> dict[tuple[int, int], float]:
        """(group, index) -> overlap score, for admitted candidates that overlap at all.

        cache_aware scores matched tokens; v1 scores weighted whole blocks.
        """
        cands, gpu, offload = inputs.candidates, inputs.gpu_match_tokens, inputs.offload_match_tokens
        s, block = self.settings, max(1, self.settings.block_size)
        if not self.multi_tier or not offload:
            weight = s.gpu_overlap_weight if self.multi_tier else 1.0
            size = block if self.multi_tier else 1  # v1 counts whole blocks, cache_aware tokens
            hits = [((g, i), gpu.get(cands[i].instance_id, 0)) for g, group in enumerate(groups) for i in group]
            return {where: weight * (tokens // size) for where, tokens in hits if tokens}
        position = {cands[i].instance_id: (g, i) for g, group in enumerate(groups) for i in group}
        scores: dict[tuple[int, int], float] = {}
        for instance_id in [*gpu, *(k for k in offload if k not in gpu)]:
            where = position.get(instance_id)
            if where is None:
                continue  # not an admitted candidate
            gpu_blocks = gpu.get(instance_id, 0) // block
            offload_blocks = max(0, offload.get(instance_id, 0) // block - gpu_blocks)
            scores[where] = s.gpu_overlap_weight * gpu_blocks + s.lmcache_overlap_weight * offload_blocks
        return scores

    def _hit_ratio(self, inputs: DecisionInputs, instance_id: str) -> float:
        hit = inputs.gpu_match_tokens.get(instance_id, 0)
        if self.multi_tier:
            hit = max(hit, inputs.offload_match_tokens.get(instance_id, 0))
        return hit / max(1, len(inputs.request.token_ids))

    def _smallest_tree(self, inputs: DecisionInputs, flat: list[tuple[int, int]]) -> Choice:
        cands, trees = inputs.candidates, inputs.tree_tokens
        group, index = min(flat, key=lambda gi: (trees.get(cands[gi[1]].instance_id, 0), cands[gi[1]].num_inflight, gi))
        return Choice(index, group, 0.0, "smallest_tree")

    def _is_imbalanced(self, inputs: DecisionInputs, groups: Groups) -> bool:
        s, cands = self.settings, inputs.candidates
        threshold = s.balance_token_usage_threshold
        if threshold < 1.0 and [
            i for group in groups for i in group if cands[i].kv_tokens >= threshold * cands[i].kv_capacity_tokens > 0
        ]:
            return True
        loads = [cands[i].num_inflight for group in groups for i in group]
        high, low = max(loads), min(loads)
        return high - low > s.balance_abs_threshold and high > s.balance_rel_threshold * low


def _break_tie(inputs: DecisionInputs, tied: list[tuple[int, int]]) -> tuple[int, int]:
    """Among equally scored (group, index) pairs: lowest load, then smallest tree, then priority order."""
    cands = inputs.candidates
    loads = [cands[i].num_inflight for _, i in tied]
    lowest = min(loads)
    tied = [gi for gi, load in zip(tied, loads, strict=True) if load == lowest]
    if len(tied) == 1:
        return tied[0]
    trees = inputs.tree_tokens
    return min(tied, key=lambda gi: (trees.get(cands[gi[1]].instance_id, 0), gi))
