"""The rollout side of an agentic run, in one process on the wall clock: real router, session scheduler
and engines, an agent workload in the coordinator's seat (psrl.sim.agent_workload), no trainer.

    AgentRollout(config, workload, engines).run(budget_s)  ->  AgentOutcome

Each round delivers what is queued, lets the router place requests, steps every instance's engine
once, hands the tools' due answers to the session scheduler and fires the flows' timers, at the wall
clock's time (the tools' delays are real seconds). Instances share nothing but the process: on one GPU
their engines take turns, as instances time-sharing a device do.

What the flows publish (and the logged kinds they send) can go to an event log in ``log_dir`` with
the run's ``config.yaml``, so ``psrl replay --check all log_dir`` re-decides the recorded decisions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from bus.codec import Encoder
from bus.eventlog import EventLogWriter
from bus.messages import GenerateRequest, SessionEnd, TurnDone, TurnNext
from bus.stamp import Stamper
from psrl.config import Config
from psrl.config.loader import to_yaml
from psrl.engine import Engine
from psrl.engine.outputs import StepOutput
from psrl.flows.driver import MemoryWeights
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.instance import InstanceFlow
from psrl.flows.local import LocalBus
from psrl.flows.router import RouterFlow
from psrl.sim.agent_workload import AgentSessions, AgentSource, AgentWorkload, SyntheticTools, TurnClock
from psrl.sim.step_trace import StepRecord, before_step, step_record

IDLE_SLEEP_S = 0.001  # a round with no engine work waits this long for the tools (no busy spin)


@dataclass
class AgentOutcome:
    wall_s: float
    turns: int = 0
    sessions: int = 0
    failed_sessions: int = 0
    hit_tokens: int = 0
    queried_tokens: int = 0
    reusable_tokens: int = 0  # the previous turn's whole context, summed over continuing turns
    fresh_tokens: int = 0  # first prompts and tool outputs: prefilled once in any case
    preemptions: int = 0
    hung_s: float = 0.0
    hangs: int = 0
    context_ends: int = 0
    max_hold_s: float = 0.0  # the longest a ready turn waited for its first token
    engine_busy_s: float = 0.0  # summed over the engines (they take turns on one thread)
    ttft_s: list[float] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)  # every engine's, in the order they ran (if recorded)

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall_s

    @property
    def sessions_per_s(self) -> float:
        return self.sessions / self.wall_s

    @property
    def reuse_of_perfect(self) -> float:
        return self.hit_tokens / max(self.reusable_tokens, 1)

    @property
    def reprefill_per_turn(self) -> float:
        """Prefilled tokens that had been computed before (a miss on the previous context, a preemption)."""
        return max(0, self.queried_tokens - self.hit_tokens - self.fresh_tokens) / max(self.turns, 1)

    def merged(self, other: AgentOutcome) -> AgentOutcome:
        """Two runs of the same setting as one: counts and times add up, waits pool."""
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        summed["max_hold_s"] = max(self.max_hold_s, other.max_hold_s)
        return AgentOutcome(**summed)

    def ttft(self, quantile: float) -> float:
        return float(np.quantile(self.ttft_s, quantile)) if self.ttft_s else float("nan")


class EventLog:
    """What the actors' event log would hold: every publication and every logged send, stamped per sender."""

    def __init__(self, directory: Path, config: Config) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.yaml").write_text(to_yaml(config))
        self.writer = EventLogWriter(directory / "events")
        self.encoder = Encoder()
        self.stampers: dict[str, Stamper] = {}

    def record(self, sender: str, effect: Effect) -> None:
        if isinstance(effect, Publish):
            stream = sender
        elif isinstance(effect, Send) and effect.message.LOGGED:
            stream = f"{sender}.link"
        else:
            return
        stamper = self.stampers.setdefault(stream, Stamper(stream))
        envelope = stamper.stamp(effect.message, None, effect.model_version, effect.request_id, effect.prompt_id)
        self.writer.append(self.encoder.encode(envelope, effect.message))

    def close(self) -> None:
        self.writer.close()


class WatchedEngine:
    """An engine whose steps report each request's new tokens to the turn clock (the instance streams them
    to the router only every few tokens, too late to time a first token)."""

    def __init__(self, engine: Engine, clock: TurnClock, now: Callable[[], float], *, record_steps: bool) -> None:
        self.engine, self.turn_clock, self.now = engine, clock, now
        self.busy_s = 0.0  # wall time inside the engine's steps (they return with their tokens on the host)
        self.steps: list[StepRecord] | None = [] if record_steps else None

    def step(self) -> StepOutput:
        seqs, before = before_step(self.engine.scheduler) if self.steps is not None else ([], [])
        started = time.perf_counter()
        out = self.engine.step()
        elapsed = time.perf_counter() - started
        self.busy_s += elapsed
        if self.steps is not None:
            self.steps.append(step_record(seqs, before, elapsed))
        if out.outputs:
            now = self.now()
            self.turn_clock.tokens([int(o.request_id) for o in out.outputs if o.token_ids], now)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class AgentRollout:
    def __init__(
        self,
        config: Config,
        workload: AgentWorkload,
        engines: list[Engine],
        *,
        log_dir: Path | None = None,
        record_steps: bool = False,
    ) -> None:
        """``record_steps``: keep every engine step (``AgentOutcome.steps``, psrl.sim.step_trace), for a
        cost model fitted to the run; off, the loop does not look at the schedulers before each step."""
        if len(engines) != config.topology.n_rollout_instances:
            raise ValueError(
                f"{len(engines)} engines for topology.n_rollout_instances={config.topology.n_rollout_instances}"
            )
        self.config, self.workload, self.engines = config, workload, engines
        self.started = time.perf_counter()
        self.tools = SyntheticTools(workload, self.now)
        self.source = AgentSource(workload, self.tools)
        self.router = RouterFlow(config)
        weights = MemoryWeights()
        self.clock = TurnClock()
        self.watched = [WatchedEngine(engine, self.clock, self.now, record_steps=record_steps) for engine in engines]
        self.instances = [
            InstanceFlow(f"rollout-{i}", config, watched, weights, clock=self.now)
            for i, watched in enumerate(self.watched)
        ]
        self.session = AgentSessions(config, self.tools, workload)
        self.bus = LocalBus(tap=self._tap)
        self.bus.attach("coordinator", self.source)
        self.bus.attach("router", self.router, self.router.BUS_KINDS)
        self.bus.attach("session", self.session, self.session.BUS_KINDS)
        for instance in self.instances:
            self.bus.attach(instance.name, instance, instance.BUS_KINDS)
        flows = [("router", self.router), ("session", self.session), *((i.name, i) for i in self.instances)]
        self._timers = [(name, t, t.interval_s) for name, flow in flows for t in flow.timers()]
        self.counts = {"turns": 0, "sessions": 0, "reusable": 0, "fresh": 0}
        self.last_context: dict[int, int] = {}
        self.continued: set[tuple[int, int]] = set()
        self.event_log = None if log_dir is None else EventLog(log_dir, config)
        self.baseline = [_engine_counters(e) for e in engines]

    def now(self) -> float:
        return time.perf_counter() - self.started

    def _tap(self, sender: str, effect: Effect, now: float) -> None:
        if self.event_log is not None:
            self.event_log.record(sender, effect)
        message = effect.message if isinstance(effect, (Send, Publish)) else None
        if isinstance(message, GenerateRequest) and sender == "coordinator":
            self.clock.became_ready(message.request_id, now)
            self.counts["fresh"] += len(message.prompt_token_ids)
        elif isinstance(message, TurnDone):
            self.counts["turns"] += 1
            self.last_context[message.request_id] = message.num_tokens
        elif isinstance(message, TurnNext):
            # a continuing turn could reuse the whole previous context; its tool output is new
            if (message.request_id, message.turn) not in self.continued:
                self.continued.add((message.request_id, message.turn))
                self.counts["reusable"] += self.last_context.get(message.request_id, 0)
        elif isinstance(message, SessionEnd) and not message.error:
            self.counts["sessions"] += 1

    def run(self, budget_s: float) -> AgentOutcome:
        """Run the workload for ``budget_s`` seconds of wall clock; what finished in that time counts."""
        self.started = time.perf_counter()
        self.bus.post("router", self.router.start(0.0), 0.0)
        for instance in self.instances:
            self.bus.post(instance.name, instance.start(0.0), 0.0)
        while (now := self.now()) < budget_s:
            self._round(now)
        outcome = self._outcome(self.now())
        self._stop()
        return outcome

    def _round(self, now: float) -> None:
        self.bus.post("coordinator", self.source.tick(now), now)
        self.bus.deliver(now)
        self.bus.post("router", self.router.route(now), now)
        busy = False
        for instance in self.instances:
            busy |= instance.engine.has_unfinished_requests()
            self.bus.post(instance.name, instance.step(now), now)
        self.bus.deliver(now)
        for reply in self.tools.take(now):
            if not reply.done:
                self.clock.became_ready(reply.request_id, now)
                self.counts["fresh"] += len(reply.observation_token_ids) + 1  # + the turn's last token
            self.bus.post("session", self.session.handle(reply, now), now)
        self.bus.deliver(now)
        for index, (name, timer, due) in enumerate(self._timers):
            if now >= due:
                self.bus.post(name, timer.callback(now), now)
                self._timers[index] = (name, timer, now + timer.interval_s)
        if not busy:
            time.sleep(IDLE_SLEEP_S)

    def _outcome(self, wall_s: float) -> AgentOutcome:
        after = [_engine_counters(e) for e in self.engines]
        delta = [a - b for a, b in zip(np.sum(after, axis=0), np.sum(self.baseline, axis=0), strict=True)]
        waiting = [wall_s - ready for ready in self.clock.waiting.values()]
        return AgentOutcome(
            wall_s=wall_s, turns=self.counts["turns"], sessions=self.counts["sessions"],
            failed_sessions=self.source.num_failed, hit_tokens=int(delta[0]), queried_tokens=int(delta[1]),
            reusable_tokens=self.counts["reusable"], fresh_tokens=self.counts["fresh"], preemptions=int(delta[2]),
            hung_s=self.session.num_hung_s, hangs=self.session.counters["hangs"],
            context_ends=self.tools.num_context_ends,
            max_hold_s=max([*self.clock.ttft_s, *waiting], default=0.0), ttft_s=list(self.clock.ttft_s),
            engine_busy_s=sum(w.busy_s for w in self.watched),
            steps=[step for watched in self.watched for step in watched.steps or []],
        )  # fmt: skip

    def _stop(self) -> None:
        """Leave the engines empty for the next setting: every request aborted, no prefix kept."""
        self.source.close()
        for engine in self.engines:
            engine.abort_all()
            engine.reset_prefix_cache()
            if engine.kv_tier is not None:
                engine.kv_tier.clear()
        if self.event_log is not None:
            self.event_log.close()


def _engine_counters(engine: Engine) -> tuple[int, int, int]:
    status = engine.status()
    return (status.num_prefix_hit_tokens, status.num_prefix_queried_tokens, status.num_preemptions_total)
