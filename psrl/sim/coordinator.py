"""The simulated coordinator: ``actors/coordinator.py``'s flow around the real coordination code.

Real decision code throughout: the dispatch throttle (``dispatch_allowance``), chunk release in
occupancy order (``ChunkEmitter``), the per-instance view (``InstanceBook``) and every tick's sync
and migration decision (``decide_tick`` with the configured ``SyncPolicy``), with the same inputs
the actor builds. The sync itself (pause the instance at the router, abort or drain it, pull,
resume) and migration (abort the newest requests so the router re-places them) are carried out
by the router and the modelled engines.

The simulator's own staleness check runs here, at hand-over to the trainer: for every trajectory
of a buffer ``b`` it checks ``V_traj <= b <= V_traj + eta`` and that every token was produced by
a version in ``[V_traj, b]``, from its own records (independently of the ledger's count).
There are no rewards in a simulation: a group filter (``algorithm.filter_groups``) keeps every group.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from psrl.config import Config
from psrl.config.rules import chunk_plan
from psrl.coordination.chunks import Chunk, ChunkEmitter
from psrl.coordination.instances import InstanceBook
from psrl.coordination.state import CoordinationInputs, RouterFacts
from psrl.coordination.sync import SyncPolicy
from psrl.coordination.tick import decide_tick
from psrl.routing.cost_model import CostModel
from psrl.routing.instance import InstanceSnapshot
from psrl.sim.events import EventQueue, SimulationError
from psrl.sim.fleet import Fleet
from psrl.sim.models import PullModel
from psrl.sim.router import SimRouter, SimTrajectory
from psrl.sim.stats import SimStats
from psrl.sim.trainer import SimTrainer, TrainChunk
from psrl.sim.workload import Workload
from psrl.staleness.throttle import dispatch_allowance


@dataclass
class _Group:
    trajectories: dict[int, SimTrajectory] = field(default_factory=dict)  # child -> finished trajectory
    winners: tuple[int, ...] = ()


class SimCoordinator:
    def __init__(
        self,
        config: Config,
        clock: EventQueue,
        router: SimRouter,
        fleet: Fleet,
        workload: Workload,
        stats: SimStats,
        *,
        cost: CostModel | None,
        pull: PullModel,
        total_steps: int,
        stall_s: float,
    ) -> None:
        self.config, self.clock, self.router, self.fleet = config, clock, router, fleet
        self.workload, self.stats = workload, stats
        self.pull, self.total_steps, self.stall_s = pull, total_steps, stall_s
        self.trainer: SimTrainer | None = None
        rc = config.psrl.rollout_coordination
        self.is_partial_rollout = rc.partial_rollout.enable
        self.sync_settings = rc.sync_and_mig_strategy
        max_seqs = rc.routing_strategy.max_concurrent_seqs_per_instance
        self.sync_policy = SyncPolicy(self.sync_settings, partial_rollout=self.is_partial_rollout, cost_model=cost,
                                      max_concurrent_seqs=max_seqs)  # fmt: skip
        self.emitter = ChunkEmitter(chunk_plan(config).chunk_groups, config.psrl.staleness_buffer_entries)
        self.book = InstanceBook()
        self.num_children = config.responses_per_prompt
        self.groups: dict[int, _Group] = {}
        self.ps_version = 0
        self.next_prompt_id = 0
        self.num_dispatched = 0  # counted groups (the throttle's count); replacements are not counted
        self.version_times: deque[float] = deque(maxlen=8)
        self.response_lengths: deque[int] = deque(maxlen=256)
        self.is_finished = False
        self.last_progress_s = 0.0

    def start(self, now: float) -> None:
        self._dispatch_groups(now)
        self.clock.at(now + self._tick_s, self._tick)

    @property
    def _tick_s(self) -> float:
        return self.sync_settings.check_interval_in_ms / 1000

    # ------------------------------------------------------------------ dispatch

    def _dispatch_groups(self, now: float) -> None:
        if self.is_finished:
            return
        allowance = dispatch_allowance(
            ps_version=self.ps_version, initial_version=0, staleness=self.config.psrl.staleness,
            max_dispatch_ahead=self.config.psrl.max_dispatch_ahead,
            groups_per_buffer=self.config.entries_per_buffer, num_dispatched=self.num_dispatched,
        )  # fmt: skip
        for _ in range(allowance):
            self._open_group(now)
            self.num_dispatched += 1

    def _open_group(self, now: float) -> None:
        prompt_id = self.next_prompt_id
        self.next_prompt_id += 1
        self.groups[prompt_id] = _Group()
        num_prompt = self.workload.prompt_tokens(prompt_id)
        for child in range(self.num_children):
            request_id = prompt_id * self.num_children + child
            max_tokens = self.workload.response_tokens(request_id, num_prompt)
            self.router.submit(SimTrajectory(request_id, prompt_id, child, num_prompt, max_tokens), now)
        self.stats.num_requests += self.num_children
        self.stats.num_groups += 1

    def on_refill(self, prompt_ids: list[int], now: float) -> None:
        for prompt_id in prompt_ids:
            self.groups.pop(prompt_id, None)
            self._open_group(now)  # a replacement: outside the throttle

    # ------------------------------------------------------------------ results and groups (from the router)

    def on_finished(self, traj: SimTrajectory, now: float) -> None:
        group = self.groups.get(traj.prompt_id)
        if group is not None:
            group.trajectories[traj.child] = traj
            self.response_lengths.append(traj.num_generated)
            self.last_progress_s = now

    def on_group_complete(self, prompt_id: int, winners: tuple[int, ...], now: float) -> None:
        group = self.groups.get(prompt_id)
        if group is None or not all(c in group.trajectories for c in winners):
            raise SimulationError(f"group {prompt_id} completed without its results")
        group.winners = winners
        self.router.group_complete(prompt_id, now)

    def on_group_drop(self, prompt_id: int, reason: str, now: float) -> None:
        self.groups.pop(prompt_id, None)

    def on_occupied(self, prompt_id: int, buffer: int, now: float) -> None:
        if prompt_id in self.groups:
            self._hand_over(self.emitter.on_occupied(buffer, prompt_id), now)

    def on_buffer_ready(self, buffer: int, prompt_ids: list[int], now: float) -> None:
        self._hand_over(self.emitter.on_ready(buffer, prompt_ids), now)

    def _hand_over(self, chunks: list[Chunk], now: float) -> None:
        while chunks:
            for chunk in chunks:
                self._send_chunk(chunk, now)
            chunks = []
            if self.emitter.is_current_done():
                self.router.consume(self.emitter.current, now)
                chunks = self.emitter.advance()

    def _send_chunk(self, chunk: Chunk, now: float) -> None:
        if self.trainer is None:
            raise RuntimeError("the simulated coordinator has no trainer")
        num_trajectories = num_tokens = 0
        for prompt_id in chunk.prompt_ids:
            group = self.groups.pop(prompt_id, None)
            if group is None:
                continue
            for child in group.winners:
                traj = group.trajectories[child]
                self._check_staleness(traj, chunk.buffer)
                num_trajectories += 1
                num_tokens += traj.num_generated
        self.trainer.enqueue(TrainChunk(chunk.buffer, chunk.is_last, num_trajectories, num_tokens), now)

    def _check_staleness(self, traj: SimTrajectory, buffer: int) -> None:
        staleness = buffer - traj.v_traj
        self.stats.staleness[staleness] += 1
        self.stats.num_trained += 1
        if len({version for version, _ in traj.segments}) > 1:
            self.stats.num_mixed_versions += 1
        if not 0 <= staleness <= self.config.psrl.staleness:
            self.stats.num_bound_violations += 1
        for version, count in traj.segments:
            if not traj.v_traj <= version <= buffer:
                self.stats.num_token_version_violations += count

    # ------------------------------------------------------------------ trainer, weights, instances

    def on_progress(self, step: int, now: float) -> None:
        self.last_progress_s = now
        if step >= self.total_steps:
            self.is_finished = True

    def on_published(self, version: int, now: float) -> None:
        if version > self.ps_version:
            self.ps_version = version
            self.version_times.append(now)
            self._dispatch_groups(now)

    def on_loaded(self, instance: str, version: int, pull_s: float, now: float) -> None:
        self.book.loaded(instance, version, pull_s)

    def on_snapshot(self, snapshot: InstanceSnapshot, now: float) -> None:
        self.book.report(snapshot)

    # ------------------------------------------------------------------ ticks

    def _tick(self, now: float) -> None:
        if self.is_finished:
            return
        self.clock.at(now + self._tick_s, self._tick)
        self.stats.num_ticks += 1
        if now - self.last_progress_s > self.stall_s and self._is_quiet():
            raise SimulationError(self._stall_report(now))
        inputs = self._tick_inputs(now)
        decision = decide_tick(inputs, self.sync_policy, self.sync_settings)
        synced = decision.sync.instance_ids
        if synced:
            self.stats.num_sync_commands += 1
            self.router.on_sync_command(synced, inputs.ps_version)
            for instance in synced:
                self.book.sync_started(instance, now)
                engine = self.fleet.engines[instance]
                pull_s = self.pull.pull_time(self.fleet.index(instance), inputs.ps_version)
                engine.sync(now, inputs.ps_version, pull_s, abort_running=self.is_partial_rollout)
        migration = decision.migration
        if migration is not None:
            self.stats.num_migrations += 1
            self.fleet.engines[migration.source_id].migrate(now, migration.num_to_move or 0)

    def _tick_inputs(self, now: float) -> CoordinationInputs:
        """What the coordinator actor passes, from the same sources (the router's servable counts)."""
        times = self.version_times
        interval = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        task = self.config.task
        lengths = self.response_lengths
        mean_response = float(np.mean(lengths)) if lengths else float(task.max_response_length) / 2
        versions = sorted(set(self.router.versions.values()))
        return CoordinationInputs(
            now=now, ps_version=self.ps_version, instances=self.book.states(),
            router=RouterFacts(self.router.core.servable_counts(versions)), mean_version_interval_s=interval,
            mean_prompt_tokens=float(task.max_prompt_length) / 2, mean_response_tokens=mean_response,
        )  # fmt: skip

    def _is_quiet(self) -> bool:
        """Nothing is working that could move the run on: no engine has work, the trainer is idle."""
        trainer_busy = self.trainer is not None and self.trainer.is_busy
        engines_busy = any(e.num_unfinished or e.is_pulling for e in self.fleet.engines.values())
        return not trainer_busy and not engines_busy

    def _stall_report(self, now: float) -> str:
        core, ledger = self.router.core, self.router.ledger
        busy = sum(1 for e in self.fleet.engines.values() if e.num_unfinished)
        return (
            f"the simulated run stalled: nothing finished for {now - self.last_progress_s:.0f} s "
            f"(t={now:.1f} s, ps_version={self.ps_version}, queued={core.num_queued}, live={len(self.router.live)}, "
            f"instances with work={busy}, ledger={ledger.counts()})"
        )
