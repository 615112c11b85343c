"""An agent workload for the rollout side alone: sessions with long first prompts, growing contexts and slow tools.

Each session is one trajectory of the real router, session scheduler and engines: a first prompt of
``prompt_tokens`` tokens, then turns of ``gen_tokens`` generated tokens each answered by a tool whose
output (``tool_tokens`` tokens) arrives after a heavy-tailed delay (log-normal around ``tool_median_s``).
A session ends after its number of turns, or earlier when the next turn would not fit ``max_context``
(as an agent stops at its context window). Every draw depends only on (seed, session, turn), so the
same sessions reach every setting compared.

    AgentWorkload        the distributions, and each session's draws
    SyntheticTools       the session scheduler's environment port: tool outputs after their delay
    AgentSource          the coordinator's seat: keeps ``sessions`` sessions open, drops each finished one
    AgentSessions        the session scheduler, each turn's generation budget drawn by the workload
    TurnClock            each turn's time to its first token, from when it became ready

The real engines run it in ``tools/bench_agentic.py``, the modelled ones in ``psrl.sim.agentic``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from bus.messages import (
    EnvStepDone,
    GenerateRequest,
    GroupDrop,
    GroupFinished,
    Refill,
    RequestSampling,
    TrajectoryDone,
    TurnNext,
)
from bus.schema import Message
from psrl.config import Config
from psrl.flows.effects import Effect, Send
from psrl.flows.session import Session, SessionFlow

ROUTER = "router"
MAX_TOOL_DELAY_S = 30.0  # the heavy tail is cut here (a tool call that long would time out in practice)


@dataclass(frozen=True)
class AgentWorkload:
    sessions: int  # sessions open at once
    prompt_tokens: tuple[int, int]  # first prompt, uniform in [lo, hi]
    turns: tuple[int, int]  # turns per session, uniform in [lo, hi]
    gen_tokens: tuple[int, int]  # generated per turn, log-uniform in [lo, hi]
    tool_tokens: tuple[int, int]  # tool output per turn, log-uniform in [lo, hi]
    tool_median_s: float  # median tool latency (log-normal)
    tool_sigma: float  # log-normal sigma of the tool latency
    max_context: int  # a session stops before its context would exceed this
    vocab: tuple[int, int]  # token ids of the synthetic text, in [lo, hi)
    ramp_s: float = 0.0  # sessions open evenly over this long at the start (not all prefilled at once)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "turns", "gen_tokens", "tool_tokens", "vocab"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"AgentWorkload.{name}={lo, hi}: needs 0 < lo <= hi")
        if self.prompt_tokens[1] + self.gen_tokens[1] > self.max_context:
            raise ValueError(
                f"AgentWorkload.max_context={self.max_context} is below the longest first turn "
                f"({self.prompt_tokens[1]} + {self.gen_tokens[1]} tokens): raise it or shorten the prompts"
            )

    def _rng(self, session: int, turn: int, what: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, session, turn, what])

    def prompt(self, session: int) -> np.ndarray:
        rng = self._rng(session, 0, 0)
        length = int(rng.integers(self.prompt_tokens[0], self.prompt_tokens[1] + 1))
        return rng.integers(self.vocab[0], self.vocab[1], length, dtype=np.int32)

    def num_turns(self, session: int) -> int:
        return int(self._rng(session, 0, 1).integers(self.turns[0], self.turns[1] + 1))

    def gen_len(self, session: int, turn: int) -> int:
        return _log_uniform(self._rng(session, turn, 2), self.gen_tokens)

    def tool_output(self, session: int, turn: int) -> np.ndarray:
        rng = self._rng(session, turn, 3)
        return rng.integers(self.vocab[0], self.vocab[1], _log_uniform(rng, self.tool_tokens), dtype=np.int32)

    def tool_delay_s(self, session: int, turn: int) -> float:
        rng = self._rng(session, turn, 4)
        return min(MAX_TOOL_DELAY_S, float(rng.lognormal(math.log(self.tool_median_s), self.tool_sigma)))


def _log_uniform(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    lo, hi = bounds
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


@dataclass(order=True)
class _DueReply:
    due: float
    request_id: int
    reply: EnvStepDone = field(compare=False)


class SyntheticTools:
    """The environment port of the session scheduler (``psrl.flows.session.EnvRunner``): each step's
    answer, the tool's output or the end of the session, becomes due after the tool's delay."""

    def __init__(
        self, workload: AgentWorkload, clock: Callable[[], float], on_due: Callable[[float], None] | None = None
    ) -> None:
        """``on_due(time)``: told when each answer becomes due (an event-driven clock wakes then)."""
        self.workload = workload
        self.clock = clock
        self.on_due = on_due
        self.prompt_lens: dict[int, int] = {}
        self.tool_lens: dict[int, int] = {}  # tool tokens each session received so far
        self._pending: list[_DueReply] = []
        self._cancelled: set[int] = set()
        self.num_context_ends = 0  # sessions stopped by max_context before their last turn

    def open(self, request_id: int, prompt_len: int) -> None:
        self.prompt_lens[request_id] = prompt_len
        self.tool_lens[request_id] = 0

    def submit(self, request_id: int, prompt_id: int, turn: int, actions: list[np.ndarray]) -> None:
        w = self.workload
        context = self.prompt_lens[request_id] + sum(len(a) for a in actions) + self.tool_lens[request_id]
        output = w.tool_output(prompt_id, turn)
        last = turn + 1 >= w.num_turns(prompt_id)
        too_long = context + len(output) + w.gen_len(prompt_id, turn + 1) > w.max_context
        self.num_context_ends += too_long and not last
        done = last or too_long
        observation = np.zeros(0, np.int32) if done else output
        self.tool_lens[request_id] += len(observation)
        delay = w.tool_delay_s(prompt_id, turn)
        reply = EnvStepDone(
            request_id=request_id, turn=turn, observation_token_ids=observation, reward=1.0 if done else 0.0,
            acc=1.0 if done else 0.0, done=done, latency_ms=delay * 1000,
        )  # fmt: skip
        self._cancelled.discard(request_id)
        due = self.clock() + delay
        heapq.heappush(self._pending, _DueReply(due, request_id, reply))
        if self.on_due is not None:
            self.on_due(due)

    def cancel(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    def take(self, now: float) -> list[EnvStepDone]:
        """The answers due by ``now``."""
        due: list[EnvStepDone] = []
        while self._pending and self._pending[0].due <= now:
            pending = heapq.heappop(self._pending)
            if pending.request_id not in self._cancelled:
                due.append(pending.reply)
        return due


class AgentSource:
    """Opens sessions (one-response groups) up to ``workload.sessions`` at once; a finished session's
    group is dropped at once (nothing trains here) and a fresh session takes its place. Sessions open
    evenly over ``ramp_s`` at the start; after ``close()`` no new one opens."""

    def __init__(self, workload: AgentWorkload, tools: SyntheticTools) -> None:
        self.workload = workload
        self.tools = tools
        self.next_session = 0
        self.num_open = 0
        self.num_done = 0
        self.num_failed = 0
        self.is_closed = False
        self.opened_at: dict[int, float] = {}
        self._out: list[Effect] = []

    def close(self) -> None:
        self.is_closed = True

    def tick(self, now: float) -> list[Effect]:
        """Open the sessions the ramp (or a finished session) makes room for."""
        w = self.workload
        allowed = w.sessions if w.ramp_s <= 0 else min(w.sessions, 1 + int(w.sessions * now / w.ramp_s))
        while not self.is_closed and self.num_open < allowed:
            self._open(now)
        out, self._out = self._out, []
        return out

    def _open(self, now: float) -> None:
        session = self.next_session
        self.next_session += 1
        self.num_open += 1
        prompt = self.workload.prompt(session)
        self.tools.open(session, len(prompt))
        self.opened_at[session] = now
        sampling = RequestSampling(
            max_tokens=self.workload.gen_len(session, 0), temperature=1.0, seed=session, ignore_eos=True
        )
        request = GenerateRequest(request_id=session, prompt_id=session, prompt_token_ids=prompt, sampling=sampling)
        self._out.append(Send(ROUTER, request, request_id=session, prompt_id=session))

    def handle(self, message: Message, now: float) -> list[Effect]:
        if isinstance(message, TrajectoryDone):
            self.num_open -= 1
            if message.error:
                self.num_failed += 1
            else:
                self.num_done += 1
        elif isinstance(message, GroupFinished):
            drop = GroupDrop(prompt_id=message.prompt_id, reason="measured")  # frees its staleness slot
            self._out.append(Send(ROUTER, drop, prompt_id=message.prompt_id))
        elif isinstance(message, Refill):
            self.num_open -= len(message.prompt_ids)
        return self.tick(now)

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        return []


class AgentSessions(SessionFlow):
    """The session scheduler, with each turn's generation budget drawn by the workload (an agent sets
    its own max_tokens per call) instead of ``env.max_turn_tokens`` for every turn."""

    def __init__(self, config: Config, tools: SyntheticTools, workload: AgentWorkload) -> None:
        super().__init__(config, tools)
        self.workload = workload

    def _send_turn(self, session: Session, turn: TurnNext) -> None:
        budget = self.workload.gen_len(session.prompt_id, turn.turn)
        super()._send_turn(session, msgspec.structs.replace(turn, max_tokens=budget))


@dataclass
class TurnClock:
    """When each turn became ready (its prompt or its tool output arrived) and when its first token came: a
    turn's time to first token takes in the session's hold (hung by ThunderAgent), its queueing and its prefill."""

    waiting: dict[int, float] = field(default_factory=dict)  # request -> when its current turn became ready
    ttft_s: list[float] = field(default_factory=list)

    def became_ready(self, request_id: int, now: float) -> None:
        self.waiting[request_id] = now

    def tokens(self, request_ids: Sequence[int], now: float) -> None:
        """The requests that produced a token at ``now``: the first since each became ready is timed."""
        for request_id in request_ids:
            ready = self.waiting.pop(int(request_id), None)
            if ready is not None:
                self.ttft_s.append(now - ready)
