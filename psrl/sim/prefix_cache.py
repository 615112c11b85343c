"""The prefix cache of a modelled engine, per session: what a turn leaves behind, and what the next one reuses.

A multi-turn session sends every turn to the router as one request id with its whole context; the
real engine finds the previous turn's keys/values in its prefix cache (whole blocks, every token but
the last sampled one, ``psrl.engine.block_manager``) if the session comes back to the same instance
before those blocks are reused. Here each request id that left the engine (its turn finished, or it
was preempted) keeps ``cached`` tokens, counted in whole blocks; the entries live in the KV room the
running requests leave free and go least recently used first when that room shrinks. A weight load
empties the cache (blocks of other weights are never reused: psrl.engine's invalidation rule).

With an offload tier (``tier_tokens`` > 0, ``psrl.lmcache``) an entry pushed out of the KV room goes
to the tier instead of away (least recently used out when the tier is full), and a request that finds
its entry there reuses it as well: loading blocks back costs a copy, which is modelled as free (on an
H100 a 1.5B model's block loads in about a seventeenth of its prefill).

Only a session's own earlier context is modelled: prompts shared between requests of one group are
not (their prefill is charged in full).
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCacheModel:
    def __init__(self, block_size: int, tier_tokens: int = 0) -> None:
        self.block_size = block_size
        self.tier_tokens = tier_tokens
        self._cached: OrderedDict[int, int] = OrderedDict()  # request id -> cached tokens, least recent first
        self._tier: OrderedDict[int, int] = OrderedDict()  # the same, for entries in the offload tier
        self.num_cached_tokens = 0
        self.num_tier_tokens = 0
        self.num_hit_tokens = 0
        self.num_tier_hit_tokens = 0  # of num_hit_tokens: loaded back from the tier

    def admit(self, request_id: int, context: int) -> int:
        """Tokens of ``context`` the request finds cached (whole blocks, never its last token), on the
        device or in the tier; its entry goes to the request (its blocks are in use again)."""
        cached = self._cached.pop(request_id, 0)
        self.num_cached_tokens -= cached
        tiered = self._tier.pop(request_id, 0)
        self.num_tier_tokens -= tiered
        usable = (context - 1) // self.block_size * self.block_size
        hit = min(max(cached, tiered), usable)
        self.num_hit_tokens += hit
        if tiered > cached:
            self.num_tier_hit_tokens += hit
        return hit

    def keep(self, request_id: int, context: int) -> None:
        """The request left the engine with ``context`` tokens, all computed but the last one."""
        tokens = max(0, context - 1) // self.block_size * self.block_size
        self.num_cached_tokens += tokens - self._cached.pop(request_id, 0)
        self._cached[request_id] = tokens

    def fit(self, room: int) -> None:
        """Evict least recently used entries until the cache fits in ``room`` free KV tokens (into the
        tier, when there is one)."""
        while self.num_cached_tokens > max(0, room) and self._cached:
            request_id, tokens = self._cached.popitem(last=False)
            self.num_cached_tokens -= tokens
            self._offload(request_id, tokens)

    def clear(self) -> None:
        """A weight load: no entry is reused under other weights, on the device or in the tier."""
        self._cached.clear()
        self._tier.clear()
        self.num_cached_tokens = self.num_tier_tokens = 0

    def _offload(self, request_id: int, tokens: int) -> None:
        if tokens > self.tier_tokens:
            return
        self.num_tier_tokens += tokens - self._tier.pop(request_id, 0)
        self._tier[request_id] = tokens
        while self.num_tier_tokens > self.tier_tokens:
            _, dropped = self._tier.popitem(last=False)
            self.num_tier_tokens -= dropped
