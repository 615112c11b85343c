"""A modelled rollout engine: continuous batching whose step times come from the cost model.

It follows the embedded engine's scheduler (``psrl.engine.scheduler``): a step is either a
prefill step (waiting requests are admitted while the batch has room, up to ``max_num_seqs``
and the KV capacity, and their context is computed in chunks of ``max_num_batched_tokens``; the
prefill samples each admitted request's first token) or a decode step (one token for every
running request). Prefill goes first. When the KV cache cannot hold the next token of every
running request, the newest is preempted back to the front of the waiting queue with its tokens
(recomputed when it is admitted again), and ``max_num_waiting_reqs_after_preemption`` decides
when preempted requests are handed back to the router (``psrl.routing.preemption``, the real rule).

Cost: a decode step with ``n`` running requests over ``K`` resident KV tokens takes
``cost.step_time(n, K)`` and adds ``n`` tokens to ``K``; a prefill of ``t`` tokens takes
``cost.prefill_time`` per chunk plus its attention over each request's context (a turn's new
tokens attend to the cached prefix as well: ``cost.ka``). Between two changes of the batch the
steps are therefore an arithmetic series, and the time of the ``m``-th step after an anchor is
known in closed form: the model never walks through steps one by one. It only wakes at a
*boundary*: when a request finishes, when the KV cache would overflow, when a prefill or a weight
pull ends, or at the end of the step in progress when something arrives from outside (a request,
an abort, a sync or a migration command), since the real engine's actor also handles its messages
between steps. With decode rounds (``decode_steps`` > 1: the GPU step kernels sample that many tokens
on the device before the scheduler looks again) a decode phase is one round: what arrives waits for
its end, and a request whose last token comes inside the round leaves at its end (the round's other
steps ran it masked, as the kernels do); a round the KV cannot hold falls back to single steps.
Each of those costs O(log n), so a run costs time per request, not per token.

Approximations (documented, measured in docs/benchmarks.md): KV is counted in tokens with one
block of slack per request instead of exact block rounding; the prefix cache is modelled per
request id only (``session_prefix_cache``: a session's turn reuses what its earlier turns left here,
``psrl.sim.prefix_cache``); prompts shared within a group are recomputed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from psrl.engine_cost.model import CostModel, prefill_attention
from psrl.routing.budget import budget_request_tokens
from psrl.routing.instance import InstanceSnapshot
from psrl.routing.preemption import preempted_to_loop_back
from psrl.sim.events import EventQueue
from psrl.sim.prefix_cache import PrefixCacheModel

FINISHED = ""  # StayResult.reason of a request that generated all its tokens


@dataclass(frozen=True)
class EngineShape:
    max_num_seqs: int
    kv_capacity_tokens: int
    max_num_batched_tokens: int
    block_size: int
    preemption_loopback_threshold: int  # routing_strategy.max_num_waiting_reqs_after_preemption
    request_budget: int | None = None  # set when the router reads budget-rounded KV (throughput_optimal_with_budget)
    # a session's next turn reuses its earlier context if it comes back here in time (psrl.sim.prefix_cache)
    session_prefix_cache: bool = False
    tier_tokens: int = 0  # the offload tier's room for that context, in tokens (0: no tier)
    tier_copy_s_per_token: float = 0.0  # a token loaded back from the tier: its copy out and its copy back
    decode_steps: int = 1  # steps per decode round (engine.decode_steps with the GPU step kernels)


class EngineRequest:
    """One request as it reaches an engine: fresh, or a continuation with ``num_prior_tokens``."""

    __slots__ = ("dispatch_seq", "max_tokens", "num_prior_tokens", "num_prompt_tokens", "request_id")

    def __init__(
        self, request_id: int, num_prompt_tokens: int, num_prior_tokens: int, max_tokens: int, dispatch_seq: int
    ) -> None:
        if not 0 <= num_prior_tokens < max_tokens:
            raise ValueError(f"request {request_id}: {num_prior_tokens} prior tokens of {max_tokens}")
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_prior_tokens = num_prior_tokens
        self.max_tokens = max_tokens
        self.dispatch_seq = dispatch_seq


@dataclass(frozen=True, slots=True)
class StayResult:
    """A request left the engine: finished (``reason`` empty) or interrupted / aborted."""

    request_id: int
    num_generated: int  # response tokens in all, prior ones included
    num_generated_here: int  # of which this engine generated (all at ``version``)
    version: int
    reason: str


class EngineSink(Protocol):
    def on_result(self, engine: ModelledEngine, result: StayResult, now: float) -> None: ...

    def on_loaded(self, engine: ModelledEngine, version: int, pull_s: float, now: float) -> None: ...

    def on_changed(self, engine: ModelledEngine, now: float) -> None: ...


class Phase(Enum):
    IDLE = 0
    DECODE = 1
    PREFILL = 2
    PULL = 3


@dataclass(frozen=True, slots=True)
class _Add:
    request: EngineRequest


@dataclass(frozen=True, slots=True)
class _Abort:
    request_ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class _Migrate:
    num_requests: int  # 0 = all


@dataclass(frozen=True, slots=True)
class _Sync:
    version: int
    pull_s: float
    abort_running: bool


_Command = _Add | _Abort | _Migrate | _Sync


class _Seq:
    __slots__ = (
        "cached",
        "finish_step",
        "generated",
        "join_step",
        "loaded",
        "num_preemptions",
        "request",
        "stay_start",
    )

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.cached = 0  # context tokens the prefix cache held at admission (not prefilled)
        self.loaded = 0  # of those, tokens copied back from the offload tier
        self.generated = request.num_prior_tokens  # at join_step while decoding
        self.stay_start = request.num_prior_tokens
        self.join_step = 0
        self.finish_step = 0
        self.num_preemptions = 0

    @property
    def context(self) -> int:
        return self.request.num_prompt_tokens + self.generated


@dataclass
class EngineCounters:
    busy_s: float = 0.0  # prefilling or decoding
    pull_s: float = 0.0
    num_decode_tokens: int = 0
    num_generated_tokens: int = 0  # decode tokens plus the first token each prefill samples
    num_prefill_tokens: int = 0
    num_prefix_hit_tokens: int = 0  # context tokens reused from the prefix cache instead of prefilled
    num_preemptions: int = 0
    num_syncs: int = 0


class SharedDevice:
    """Engines that take turns on one device (one process stepping them in turn, as the agent benchmark
    does): while others have work, each step also waits for theirs. A phase planned while ``k`` other
    engines on the device are busy costs ``1 + k`` times its own time."""

    def __init__(self) -> None:
        self.busy: set[str] = set()

    def slowdown(self, instance_id: str) -> int:
        return 1 + len(self.busy) - (instance_id in self.busy)

    def mark(self, instance_id: str, is_busy: bool) -> None:
        if is_busy:
            self.busy.add(instance_id)
        else:
            self.busy.discard(instance_id)


class ModelledEngine:
    def __init__(
        self,
        instance_id: str,
        cost: CostModel,
        shape: EngineShape,
        clock: EventQueue,
        sink: EngineSink,
        version: int,
        device: SharedDevice | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.cost = cost
        self.device = device
        self._costs = {1: cost}  # by slowdown on a shared device
        self.shape = shape
        self.clock = clock
        self.sink = sink
        self.version = version
        self.counters = EngineCounters()
        # told the requests whose prefill sampled a token, and when (a turn's first token: psrl.sim.agentic)
        self.first_token_listener: Callable[[list[int], float], None] | None = None
        self.prefix_cache = (
            PrefixCacheModel(shape.block_size, shape.tier_tokens) if shape.session_prefix_cache else None
        )
        self.last_dispatch_seq = -1
        self.report_seq = 0
        self.phase = Phase.IDLE
        self._running: dict[int, _Seq] = {}  # decoding, in admission order
        self._prefilling: list[_Seq] = []
        self._waiting: deque[_Seq] = deque()
        self._by_id: dict[int, _Seq] = {}  # every request in the engine, in arrival order
        self._finish_heap: list[tuple[int, int]] = []  # (finish step, request id), lazily pruned
        self._step = 0  # decode steps run so far (at the anchor)
        self._kv = 0  # KV tokens of the decoding requests at the anchor
        self._generated_base = 0  # sum of (generated - join_step) over decoding requests
        self._anchor = 0.0
        self._step_a = 0.0  # duration of the first step after the anchor
        self._step_b = 0.0  # growth of the step duration per step (k1 * n)
        self._phase_end = 0.0
        self._planned_steps = 0
        self._epoch = 0
        self._pending: list[_Command] = []
        self._pending_sync: tuple[int, float] | None = None
        self._in_boundary = False
        self._is_wake_scheduled = False
        self._in_round = False  # the decode phase is a round of shape.decode_steps (uninterruptible)

    # ------------------------------------------------------------------ commands (applied at the next boundary)

    def add(self, now: float, request: EngineRequest) -> None:
        self._command(now, _Add(request))

    def abort(self, now: float, request_ids: Iterable[int], reason: str) -> None:
        self._command(now, _Abort(tuple(request_ids), reason))

    def migrate(self, now: float, num_requests: int) -> None:
        """Abort the newest ``num_requests`` (0 = all) requests with reason ``migrate``."""
        self._command(now, _Migrate(num_requests))

    def sync(self, now: float, version: int, pull_s: float, *, abort_running: bool) -> None:
        """Pull ``version`` (taking ``pull_s``) once no request is left; abort them first if asked."""
        self._command(now, _Sync(version, pull_s, abort_running))

    @property
    def num_unfinished(self) -> int:
        return len(self._by_id)

    @property
    def is_pulling(self) -> bool:
        return self.phase is Phase.PULL

    # ------------------------------------------------------------------ status

    def snapshot(self, now: float) -> InstanceSnapshot:
        steps = self._steps_done(now - self._anchor) if self.phase is Phase.DECODE else 0
        n = len(self._running)
        kv = self._kv + n * steps + sum(s.context for s in self._prefilling)
        response = self._generated_base + n * (self._step + steps) + sum(s.generated for s in self._prefilling)
        cap = self.shape.kv_capacity_tokens
        budget = self._budget_tokens(steps) if self.shape.request_budget is not None else kv
        throughput = n / (self._step_a + self._step_b * steps) if self.phase is Phase.DECODE and n else 0.0
        self.report_seq += 1
        return InstanceSnapshot(
            self.instance_id, self.report_seq, self.version, n + len(self._prefilling), len(self._waiting), kv, cap,
            min(1.0, kv / cap) if cap else 0.0, budget, response, throughput, self.last_dispatch_seq,
        )  # fmt: skip

    def _budget_tokens(self, steps: int) -> int:
        budget = self.shape.request_budget or 1
        seqs = [*self._running.values(), *self._prefilling]
        total = 0
        for seq in seqs:
            generated = seq.generated + (self._step + steps - seq.join_step if seq.request.request_id in self._running
                                         else 0)  # fmt: skip
            total += budget_request_tokens(seq.request.num_prompt_tokens, generated, budget)
        return total

    # ------------------------------------------------------------------ the step clock

    def _steps_done(self, elapsed: float) -> int:
        """Whole decode steps finished ``elapsed`` seconds after the anchor (capped at the plan)."""
        if elapsed <= 0:
            return 0
        a, b = self._step_a, self._step_b
        if b <= 0:
            m = int(elapsed / a)
        else:  # largest m with m a + b m (m - 1) / 2 <= elapsed
            half = a - b / 2
            m = int((-half + math.sqrt(half * half + 2 * b * elapsed)) / b)
        while m > 0 and self._time_of(m) > elapsed:
            m -= 1
        while self._time_of(m + 1) <= elapsed:
            m += 1
        return min(m, self._planned_steps)

    def _time_of(self, steps: int) -> float:
        return steps * self._step_a + self._step_b * steps * (steps - 1) / 2

    def _schedule(self, time: float) -> None:
        self._epoch += 1
        epoch = self._epoch
        self._phase_end = time
        self.clock.at(time, lambda now: self._on_boundary(now, epoch))

    def _command(self, now: float, command: _Command) -> None:
        self._pending.append(command)
        if not self._in_boundary:  # a boundary in progress looks at its new commands when it is done
            self._wake_for_pending(now)

    def _wake_for_pending(self, now: float) -> None:
        """Make sure a boundary comes as soon as the engine can take commands."""
        if self.phase is Phase.IDLE:
            if not self._is_wake_scheduled:
                self._is_wake_scheduled = True
                self._schedule(now)
        elif self.phase is Phase.DECODE and not self._in_round:
            steps = self._steps_done(now - self._anchor) + 1  # the step in progress ends first
            if steps < self._planned_steps:
                self._planned_steps = steps
                self._schedule(self._anchor + self._time_of(steps))
        # PREFILL / PULL / a decode round: commands wait for the end of the phase, already scheduled

    # ------------------------------------------------------------------ boundaries

    def _on_boundary(self, now: float, epoch: int) -> None:
        if epoch != self._epoch:
            return  # superseded by an earlier boundary
        self._in_boundary = True
        self._is_wake_scheduled = False
        if self.phase is Phase.DECODE:
            self._commit_decode(now)
        elif self.phase is Phase.PREFILL:
            self._commit_prefill(now)
        elif self.phase is Phase.PULL:
            self._commit_pull(now)
        self.phase = Phase.IDLE
        self._finish_due(now)
        self._apply_pending(now)
        self._loop_back_preempted(now)
        self._start_next(now)
        self._in_boundary = False
        if self._pending:  # commands that callbacks of this boundary sent back to this engine
            self._wake_for_pending(now)
        self.sink.on_changed(self, now)

    def _commit_decode(self, now: float) -> None:
        steps = self._planned_steps
        n = len(self._running)
        self._step += steps
        self._kv += n * steps
        self.counters.num_decode_tokens += n * steps
        self.counters.num_generated_tokens += n * steps
        self.counters.busy_s += now - self._anchor
        self._anchor = now

    def _commit_prefill(self, now: float) -> None:
        self.counters.busy_s += now - self._anchor
        self._anchor = now
        self.counters.num_generated_tokens += len(self._prefilling)
        if self.first_token_listener is not None:
            self.first_token_listener([seq.request.request_id for seq in self._prefilling], now)
        for seq in self._prefilling:
            seq.generated += 1  # the prefill samples the first new token
            if seq.generated >= seq.request.max_tokens:
                self._leave(seq, FINISHED, now)
                continue
            self._join_decode(seq)
        self._prefilling = []

    def _commit_pull(self, now: float) -> None:
        if self._pending_sync is None:
            raise RuntimeError(f"{self.instance_id}: a pull ended without a pending sync")
        version, pull_s = self._pending_sync
        self._pending_sync = None
        self.version = version
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # keys/values of other weights are never reused
        self.counters.pull_s += pull_s
        self.counters.num_syncs += 1
        self._anchor = now
        self.sink.on_loaded(self, version, pull_s, now)

    def _join_decode(self, seq: _Seq) -> None:
        rid = seq.request.request_id
        seq.join_step = self._step
        seq.finish_step = self._step + seq.request.max_tokens - seq.generated
        self._running[rid] = seq
        self._kv += seq.context
        self._generated_base += seq.generated - seq.join_step
        heapq.heappush(self._finish_heap, (seq.finish_step, rid))

    def _leave_decode(self, seq: _Seq) -> None:
        """Take a decoding request out of the batch, bringing its token count up to date."""
        del self._running[seq.request.request_id]
        self._generated_base -= seq.generated - seq.join_step
        seq.generated += self._step - seq.join_step
        self._kv -= seq.context  # as the batch counted it: a round may have run it past its last token
        seq.generated = min(seq.generated, seq.request.max_tokens)

    def _leave(self, seq: _Seq, reason: str, now: float) -> None:
        rid = seq.request.request_id
        del self._by_id[rid]
        if self.prefix_cache is not None and reason == FINISHED:
            self.prefix_cache.keep(rid, seq.context)
            self._fit_cache()
        result = StayResult(rid, seq.generated, seq.generated - seq.stay_start, self.version, reason)
        self.sink.on_result(self, result, now)

    def _finish_due(self, now: float) -> None:
        heap = self._finish_heap
        while heap and heap[0][0] <= self._step:
            step, rid = heapq.heappop(heap)
            seq = self._running.get(rid)
            if seq is None or seq.finish_step != step:
                continue  # left the batch earlier (abort, preemption)
            self._leave_decode(seq)
            self._leave(seq, FINISHED, now)

    def _apply_pending(self, now: float) -> None:
        pending, self._pending = self._pending, []
        for command in pending:
            if isinstance(command, _Add):
                self._arrive(command.request)
            elif isinstance(command, _Abort):
                self._abort_ids(command.request_ids, command.reason, now)
            elif isinstance(command, _Migrate):
                ids = list(self._by_id)
                num = command.num_requests
                self._abort_ids(ids[-num:] if num > 0 else ids, "migrate", now)
            elif command.version > self.version:
                self._pending_sync = (command.version, command.pull_s)
                if command.abort_running:
                    self._abort_ids(list(self._by_id), "sync", now)

    def _arrive(self, request: EngineRequest) -> None:
        if request.request_id in self._by_id:
            raise ValueError(f"{self.instance_id}: request {request.request_id} is already in the engine")
        seq = _Seq(request)
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)
        self.last_dispatch_seq = max(self.last_dispatch_seq, request.dispatch_seq)

    def _abort_ids(self, request_ids: Iterable[int], reason: str, now: float) -> None:
        for rid in request_ids:
            seq = self._by_id.get(rid)
            if seq is None:
                continue
            if rid in self._running:
                self._leave_decode(seq)
            else:
                self._waiting.remove(seq)
            self._leave(seq, reason, now)

    def _loop_back_preempted(self, now: float) -> None:
        preempted = [s.request.request_id for s in self._waiting if s.num_preemptions > 0]
        if preempted:
            threshold = self.shape.preemption_loopback_threshold
            self._abort_ids(preempted_to_loop_back(preempted, len(self._waiting), threshold), "preempted", now)

    # ------------------------------------------------------------------ what runs next

    def _start_next(self, now: float) -> None:
        slowdown = 1 if self.device is None else self.device.slowdown(self.instance_id)
        self.cost = self._costs.setdefault(slowdown, self._costs[1].scaled(slowdown))
        self._start_phase(now, slowdown)
        if self.device is not None:
            self.device.mark(self.instance_id, self.phase is not Phase.IDLE)

    def _start_phase(self, now: float, slowdown: int) -> None:
        self._anchor = now
        if self._pending_sync is not None and not self._by_id:
            self.phase = Phase.PULL
            self._schedule(now + self._pending_sync[1])
            return
        if self._admit():
            if self.prefix_cache is not None:
                self._fit_cache()  # the admitted contexts take their blocks from the cached ones first
            tokens = sum(seq.context - seq.cached for seq in self._prefilling)
            self.counters.num_prefill_tokens += tokens
            self.counters.num_prefix_hit_tokens += sum(seq.cached for seq in self._prefilling)
            self.phase = Phase.PREFILL
            loaded = sum(seq.loaded for seq in self._prefilling)
            attended = sum(prefill_attention(seq.context - seq.cached, seq.cached) for seq in self._prefilling)
            copies = loaded * self.shape.tier_copy_s_per_token * slowdown
            self._schedule(now + self._prefill_time(tokens, attended) + copies)
            return
        if self._running:
            self._plan_decode(now)

    def _admit(self) -> bool:
        """Move waiting requests into the batch while it has room (sequences and KV)."""
        shape, room = self.shape, self.shape.kv_capacity_tokens - self._kv - len(self._running) * self.shape.block_size
        while self._waiting and len(self._running) + len(self._prefilling) < shape.max_num_seqs:
            seq = self._waiting[0]
            need = seq.context + shape.block_size
            if need > room and (self._running or self._prefilling):
                break  # a lone request always gets in: the context limit keeps it within the cache
            self._waiting.popleft()
            if self.prefix_cache is not None:
                from_tier = self.prefix_cache.num_tier_hit_tokens
                seq.cached = self.prefix_cache.admit(seq.request.request_id, seq.context)
                seq.loaded = self.prefix_cache.num_tier_hit_tokens - from_tier
            self._prefilling.append(seq)
            room -= need
        return bool(self._prefilling)

    def _fit_cache(self) -> None:
        """Cached prefixes live in the KV room the resident requests leave free."""
        assert self.prefix_cache is not None
        resident = self._kv + sum(seq.context for seq in self._prefilling)
        self.prefix_cache.fit(self.shape.kv_capacity_tokens - resident)

    def _prefill_time(self, tokens: int, attended: float) -> float:
        """Chunks of the token budget, each a step; the attention's work is the same however it is chunked."""
        budget = self.shape.max_num_batched_tokens
        full, rest = divmod(tokens, budget)
        steps = full * self.cost.prefill_time(budget, 0.0) + self.cost.prefill_time(rest, 0.0)
        return steps + self.cost.ka * attended

    def _plan_decode(self, now: float) -> None:
        self._preempt_to_fit()
        n = len(self._running)
        shape = self.shape
        room_steps = (shape.kv_capacity_tokens - self._kv - n * shape.block_size) // n
        heap = self._finish_heap
        while heap:  # drop entries of requests that left the batch (or of an earlier stay in it)
            seq = self._running.get(heap[0][1])
            if seq is not None and seq.finish_step == heap[0][0]:
                break
            heapq.heappop(heap)
        to_finish = heap[0][0] - self._step if heap else 1
        rounds = shape.decode_steps
        self._in_round = rounds > 1 and room_steps >= rounds
        self._planned_steps = rounds if self._in_round else max(1, min(to_finish, room_steps))
        cost = self.cost
        self._step_a = cost.k1 * self._kv + max(cost.k2, cost.k3 * n) + cost.k4
        self._step_b = cost.k1 * n
        self._anchor = now
        self.phase = Phase.DECODE
        self._schedule(now + self._time_of(self._planned_steps))

    def _preempt_to_fit(self) -> None:
        """Preempt the newest requests until every running one can take its next token."""
        shape = self.shape
        while len(self._running) > 1:
            n = len(self._running)
            if self._kv + n * (shape.block_size + 1) <= shape.kv_capacity_tokens:
                return
            newest = next(reversed(self._running.values()))
            self._leave_decode(newest)
            newest.num_preemptions += 1
            self.counters.num_preemptions += 1
            self._waiting.appendleft(newest)
            if self.prefix_cache is not None:  # its blocks are freed but keep their contents until reused
                self.prefix_cache.keep(newest.request.request_id, newest.context)
                self._fit_cache()
