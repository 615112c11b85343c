"""The prefix cache of a modelled engine, per session: what a turn leaves behind, and what the next one reuses.

A multi-turn session sends every turn to the router as one request id with its whole context; the
real engine finds the previous turn's keys/values in its prefix cache (whole blocks, every token but
the last sampled one, ``psrl.engine.block_manager``) if the session comes back to the same instance
before those blocks are reused. Here each request id that left the engine (its turn finished, or it
was preempted) keeps ``cached`` tokens, counted in whole blocks; the entries live in the KV room the
running requests leave free and go least recently used first when that room shrinks. A weight load
empties the cache (blocks of other weights are never reused: psrl.engine's invalidation rule).

Only a session's own earlier context is modelled: prompts shared between requests of one group are
not (their prefill is charged in full).
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCacheModel:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._cached: OrderedDict[int, int] = OrderedDict()  # request id -> cached tokens, least recent first
        self.num_cached_tokens = 0
        self.num_hit_tokens = 0

    def admit(self, request_id: int, context: int) -> int:
        """Tokens of ``context`` the request finds cached (whole blocks, never its last token); its entry
        goes to the request (its blocks are in use again)."""
        cached = self._cached.pop(request_id, 0)
        self.num_cached_tokens -= cached
        hit = min(cached, (context - 1) // self.block_size * self.block_size)
        self.num_hit_tokens += hit
        return hit

    def keep(self, request_id: int, context: int) -> None:
        """The request left the engine with ``context`` tokens, all computed but the last one."""
        tokens = max(0, context - 1) // self.block_size * self.block_size
        self.num_cached_tokens += tokens - self._cached.pop(request_id, 0)
        self._cached[request_id] = tokens

    def fit(self, room: int) -> None:
        """Evict least recently used entries until the cache fits in ``room`` free KV tokens."""
        while self.num_cached_tokens > max(0, room) and self._cached:
            _, tokens = self._cached.popitem(last=False)
            self.num_cached_tokens -= tokens

    def clear(self) -> None:
        self._cached.clear()
        self.num_cached_tokens = 0
