"""The prefix cache of a modelled engine, per session: what a turn leaves behind, and what the next one reuses.

A multi-turn session sends every turn to the router as one request id with its whole context; the
real engine finds the previous turn's keys/values in its prefix cache (whole blocks, every token but
the last sampled one, ``psrl.engine.block_manager``) if the session comes back to the same instance
before those blocks are reused. Here each request id that left the engine (its turn finished, or it
was preempted) keeps ``cached`` tokens, counted in whole blocks; the entries live in the KV room the
running requests leave free. When that room shrinks, blocks go as the block manager gives them up:
the least recently freed first, and a request frees its blocks last one first, so the oldest entry
loses its tail block by block and keeps the head it still has (its next turn reuses that head and
prefills the rest). A weight load empties the cache (blocks of other weights are never reused:
psrl.engine's invalidation rule).

With an offload tier (``tier_tokens`` > 0, ``psrl.lmcache``) the blocks given up go to the tier
instead of away, so an entry is a head on the device and the rest of its context in the tier; a
request reuses both (the tier's part is loaded back, at the cost of a copy that the engine model
charges). A full tier gives up its oldest blocks first, the tail of its least recently stored entry.

Only a session's own earlier context is modelled: prompts shared between requests of one group are
not (their prefill is charged in full).
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCacheModel:
    def __init__(self, block_size: int, tier_tokens: int = 0) -> None:
        self.block_size = block_size
        self.tier_tokens = tier_tokens
        self._cached: OrderedDict[int, int] = OrderedDict()  # request id -> head tokens on the device, oldest first
        # request id -> (first token, tokens) of the part in the tier, which continues the device's head
        self._tier: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self.num_cached_tokens = 0
        self.num_tier_tokens = 0
        self.num_hit_tokens = 0
        self.num_tier_hit_tokens = 0  # of num_hit_tokens: loaded back from the tier

    def admit(self, request_id: int, context: int) -> int:
        """Tokens of ``context`` the request finds cached (whole blocks, never its last token), on the
        device and then in the tier; its entry goes to the request (its blocks are in use again)."""
        head = self._cached.pop(request_id, 0)
        self.num_cached_tokens -= head
        start, tiered = self._tier.pop(request_id, (0, 0))
        self.num_tier_tokens -= tiered
        reach = start + tiered if tiered and start <= head else head
        usable = (context - 1) // self.block_size * self.block_size
        hit = min(reach, usable)
        self.num_hit_tokens += hit
        self.num_tier_hit_tokens += max(0, hit - head)
        return hit

    def keep(self, request_id: int, context: int) -> None:
        """The request left the engine with ``context`` tokens, all computed but the last one."""
        tokens = max(0, context - 1) // self.block_size * self.block_size
        self.num_cached_tokens += tokens - self._cached.pop(request_id, 0)
        self._cached[request_id] = tokens

    def fit(self, room: int) -> None:
        """Give up blocks until the cache fits in ``room`` free KV tokens: the oldest entry's tail first
        (into the tier, when there is one)."""
        room = max(0, room)
        while self.num_cached_tokens > room and self._cached:
            request_id, head = next(iter(self._cached.items()))
            dropped = min(head, self._blocks_of(self.num_cached_tokens - room))
            self.num_cached_tokens -= dropped
            if dropped < head:
                self._cached[request_id] = head - dropped  # keeps its place: still the oldest
            else:
                del self._cached[request_id]
            self._offload(request_id, head - dropped, dropped)

    def clear(self) -> None:
        """A weight load: no entry is reused under other weights, on the device or in the tier."""
        self._cached.clear()
        self._tier.clear()
        self.num_cached_tokens = self.num_tier_tokens = 0

    def _blocks_of(self, tokens: int) -> int:
        return -(-tokens // self.block_size) * self.block_size

    def _offload(self, request_id: int, start: int, tokens: int) -> None:
        """Tokens ``start`` to ``start + tokens`` of a request's context go to the tier, joining the part of
        it already there (which they come before)."""
        if self.tier_tokens <= 0:
            return
        old_start, old_tokens = self._tier.pop(request_id, (0, 0))
        self.num_tier_tokens -= old_tokens
        if old_tokens and old_start == start + tokens:
            tokens += old_tokens
        self.num_tier_tokens += tokens
        self._tier[request_id] = (start, tokens)  # the newest in the tier
        self._trim_tier()

    def _trim_tier(self) -> None:
        while self.num_tier_tokens > self.tier_tokens and self._tier:
            request_id, (start, tokens) = next(iter(self._tier.items()))
            dropped = min(tokens, self._blocks_of(self.num_tier_tokens - self.tier_tokens))
            self.num_tier_tokens -= dropped
            if dropped < tokens:
                self._tier[request_id] = (start, tokens - dropped)
            else:
                del self._tier[request_id]
