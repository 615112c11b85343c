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
  hit it falls back to the least loaded instance (ties: smaller tree). It also refuses an
  instance whose KV would exceed ``kv_capacity_threshold`` x its capacity with this request.
* The balance check and the fallbacks consider only admitted instances; cache_aware ties go
  the same way as v1's (lower load, then smaller tree).
* Load is in-flight requests plus sessions resting on the instance (their turn done, their tool
  running, their next turn pinned back there): a new session balances against every session an
  instance holds, not only those generating at this moment, while a continuing turn stays pinned.

An instance whose KV usage reaches ``overload_token_usage_threshold`` (< 1) is not admitted.
"""

from __future__ import annotations

from operator import itemgetter

from psrl.config.coordination import CacheAwarePolicy as CacheAwareSettings
from psrl.routing.decision import DecisionInputs
from psrl.routing.policies.base import Choice, Groups, least_loaded

_Key = tuple[float, int, int, int, int]  # (-overlap score, load, tree tokens, group, index)
_LOAD = itemgetter(1)


class CacheAwareRoutingPolicy:
    uses_prefix_tree = True

    def __init__(self, settings: CacheAwareSettings, *, multi_tier: bool) -> None:
        self.settings = settings
        self.multi_tier = multi_tier
        self.uses_offload_tier = multi_tier
        self.kv_admission_limit = settings.kv_capacity_threshold if multi_tier else None
        overload = settings.overload_token_usage_threshold
        self.overload_limit = overload if overload < 1.0 else None
        self.name = "cache_aware_v1" if multi_tier else "cache_aware"

    def choose(self, inputs: DecisionInputs, groups: Groups) -> Choice | str:
        keys = self._keys(inputs, groups)
        if self._is_imbalanced(inputs, groups, keys):
            choice = least_loaded(inputs, groups, count_resting=True)
            return Choice(choice.index, choice.group, choice.score, "shortest_queue")
        best = min(keys)
        cands = inputs.candidates
        if best[0] < 0 and self._hit_ratio(inputs, cands[best[4]].instance_id) > self.settings.cache_threshold:
            return Choice(best[4], best[3], -best[0], "cache_hit")
        if self.multi_tier:
            _, _, _, group, index = min(keys, key=lambda k: k[1:])
            return Choice(index, group, 0.0, "least_load")
        _, _, _, group, index = min(keys, key=lambda k: (k[2], k[1], k[3], k[4]))
        return Choice(index, group, 0.0, "smallest_tree")

    def _keys(self, inputs: DecisionInputs, groups: Groups) -> list[_Key]:
        """Per admitted candidate: (-overlap score, load, tree tokens, group, index), in one pass.

        The score is matched tokens (cache_aware) or weighted whole blocks (v1).
        """
        cands, trees, gpu, offload = (
            inputs.candidates,
            inputs.tree_tokens,
            inputs.gpu_match_tokens,
            inputs.offload_match_tokens,
        )
        s, block = self.settings, max(1, self.settings.block_size)
        if not self.multi_tier:
            weight, block = -1.0, 1
        else:
            weight = -s.gpu_overlap_weight
        if not (self.multi_tier and offload):
            return [
                (weight * (gpu.get(c.instance_id, 0) // block), c.num_sessions, trees.get(c.instance_id, 0), g, i)
                for g, group in enumerate(groups)
                for i in group
                for c in (cands[i],)
            ]
        offload_weight = -s.lmcache_overlap_weight
        keys: list[_Key] = []
        for g, group in enumerate(groups):
            for i in group:
                iid = cands[i].instance_id
                blocks = gpu.get(iid, 0) // block
                extra = max(0, offload.get(iid, 0) // block - blocks)
                keys.append((weight * blocks + offload_weight * extra, cands[i].num_sessions, trees.get(iid, 0), g, i))
        return keys

    def _hit_ratio(self, inputs: DecisionInputs, instance_id: str) -> float:
        hit = inputs.gpu_match_tokens.get(instance_id, 0)
        if self.multi_tier:
            hit = max(hit, inputs.offload_match_tokens.get(instance_id, 0))
        return hit / max(1, len(inputs.request.token_ids))

    def _is_imbalanced(self, inputs: DecisionInputs, groups: Groups, keys: list[_Key]) -> bool:
        s, cands = self.settings, inputs.candidates
        threshold = s.balance_token_usage_threshold
        if threshold < 1.0 and [
            i
            for group in groups
            for i in group
            for c in (cands[i],)
            if c.kv_tokens >= threshold * c.kv_capacity_tokens > 0
        ]:
            return True
        high, low = max(keys, key=_LOAD)[1], min(keys, key=_LOAD)[1]
        return high - low > s.balance_abs_threshold and high > s.balance_rel_threshold * low
