"""The coordinator's algorithm: prompt groups, rewards, buffers to the trainer, sync and migration.

dispatch   prompt groups (N' requests each) go to the router within the dispatch throttle, at the
           start and whenever the parameter server publishes a version
results    finished trajectories are scored; when the router reports a group's first N finished,
           the group is filtered or kept (the router then occupies its slot)
buffers    occupied groups are released to the trainer chunk by chunk (fine-grain overlap) in
           occupancy order; a fully handed-over buffer is consumed in the ledger
tick       every check interval: the sync strategy, then migration (``psrl.coordination``), from
           instance reports, the router's facts and the PS version; logged for replay
colocation with ``topology.colocate``, the consume/generate cycle switches the shared GPUs
           (``psrl.tms.ColocationSwitch``): rollout pauses while the trainer steps on a handed-over
           buffer, the trainer pauses while rollout fills the next one
eval       with ``trainer.eval_interval``: held-out rounds on an instance that holds a due version
           (``psrl.evaluation.planner``), outside the router and the staleness ledger
end        after ``trainer.total_steps`` versions the run ends (RunFinished), once the last version is
           evaluated (or ``eval.final_timeout_s`` has passed)

State: ``book`` (open groups and their results), ``emitter`` (what each buffer has released),
``instances`` (the coordinator's view of the fleet), ``ps_version`` and the recent measurements
a tick reads (version times, response lengths).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from bus.messages import (
    ActorExited,
    BufferReady,
    Consume,
    EvalResult,
    FinishReason,
    GenerateRequest,
    GroupAccept,
    GroupDrop,
    GroupFinished,
    InstanceStatus,
    InstanceSyncFailed,
    MemoryPause,
    MemoryResume,
    MemorySwitched,
    Metrics,
    MigrateCommand,
    Occupy,
    Refill,
    RouterStatus,
    RunFinished,
    ScaleDecided,
    SyncCommand,
    TickRecord,
    TrainBatch,
    TrainData,
    TrainerProgress,
    TrajectoryDone,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Message
from psrl.config import Config
from psrl.config.chunk_plan import chunk_plan
from psrl.coordination.chunks import Chunk, ChunkEmitter
from psrl.coordination.groups import GroupBook, has_learning_signal, is_success
from psrl.coordination.instances import InstanceBook
from psrl.coordination.records import encode_tick, same_situation
from psrl.coordination.state import CoordinationInputs, RouterFacts
from psrl.coordination.step_counts import FailureCounts, RateMeter
from psrl.coordination.sync import SyncPolicy
from psrl.coordination.tick import decide_tick
from psrl.engine_cost.model import CostModel
from psrl.evaluation.planner import EvalPlanner
from psrl.flows.base import Flow
from psrl.flows.effects import Effect, Handler, Timer
from psrl.flows.prompts import PromptSource, ResponseScorer
from psrl.flows.status import snapshot_from_status
from psrl.flows.train_data import train_data
from psrl.rewards.failures import FailureWatch, step_failures, stop_reason
from psrl.routing.servable import ServableCounts
from psrl.staleness.throttle import dispatch_allowance
from psrl.tasks.base import Reward
from psrl.tms import ROLLOUT, ColocationSwitch, SwitchCommand, managed_sides

ROUTER = "router"


def make_sync_policy(config: Config, cost: CostModel | None) -> SyncPolicy:
    """The sync strategy as the coordinator runs it (and ``psrl replay --check sync`` re-runs it)."""
    rc = config.psrl.rollout_coordination
    return SyncPolicy(
        rc.sync_and_mig_strategy,
        partial_rollout=rc.partial_rollout.enable,
        cost_model=cost,
        max_concurrent_seqs=rc.routing_strategy.max_concurrent_seqs_per_instance,
    )


class CoordinatorFlow(Flow):
    BUS_KINDS = (
        InstanceStatus, WeightsPublished, WeightsLoaded, InstanceSyncFailed, ActorExited, TrainerProgress,
        MemorySwitched, EvalResult, ScaleDecided,
    )  # fmt: skip

    def __init__(
        self,
        config: Config,
        prompts: PromptSource,
        scorer: ResponseScorer,
        *,
        cost: CostModel | None = None,
        initial_version: int = 0,
        first_prompt_id: int | None = None,
        record_decisions: bool = True,
        evaluation: EvalPlanner | None = None,
        log: Any = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.evaluation = evaluation
        self.final_progress: TrainerProgress | None = None  # the last step, while its evaluation runs
        self.final_since = 0.0
        self.prompts = prompts
        self.scorer = scorer
        self.record_decisions = record_decisions
        self.log = log
        self.n = config.responses_per_prompt
        self.initial_version = initial_version
        # a resumed run continues the prompt cursor its checkpoint recorded
        first = initial_version * config.entries_per_buffer if first_prompt_id is None else first_prompt_id
        self.book = GroupBook(self.n, first_prompt_id=first)
        self.emitter = ChunkEmitter(
            chunk_plan(config).chunk_groups, config.psrl.staleness_buffer_entries, initial_version
        )
        self.instances = InstanceBook()
        rc = config.psrl.rollout_coordination
        self.sync_settings = rc.sync_and_mig_strategy
        self.sync_policy = SyncPolicy(
            self.sync_settings,
            partial_rollout=rc.partial_rollout.enable,
            cost_model=cost,
            max_concurrent_seqs=rc.routing_strategy.max_concurrent_seqs_per_instance,
        )
        self.trainers = [f"trainer-{rank}" for rank in range(config.topology.n_trainer_ranks)]
        self.ps_version = initial_version if initial_version == 0 else -1  # a resumed trainer re-pushes
        self.version_times: deque[float] = deque(maxlen=8)
        self.router_facts = RouterFacts()
        self.last_tick_inputs: CoordinationInputs | None = None
        self.response_lengths: deque[int] = deque(maxlen=256)
        self.num_duplicates = 0  # router messages delivered twice (results, group verdicts), taken once
        self.reward_history: list[tuple[int, float]] = []
        self.started = 0.0
        self.rate = RateMeter(started=0.0)
        self.failures = FailureCounts()
        self.reward_watch = FailureWatch(config.reward.max_error_fraction, config.reward.error_patience)
        self.is_finished = False
        self.handed_over: list[TrainData] = []
        # chunks handed to the trainer ranks whose version was not reported yet: a restarted rank gets
        # them again (it skips what it already trained); at most the buffers between the trainer's
        # version and the newest handed over
        self.unacknowledged: dict[int, list[TrainData]] = {}
        self.switch: ColocationSwitch | None = None
        if config.topology.colocate:
            instances = [f"rollout-{i}" for i in range(config.topology.n_rollout_instances)]
            managed = managed_sides(config.psrl.tms.range)
            self.switch = ColocationSwitch(self.trainers, instances, managed, trained_version=initial_version)

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            TrajectoryDone: self._on_done,  # from the router: a trajectory ended
            GroupFinished: self._on_group_finished,  # from the router: a group's first N finished
            GroupDrop: self._on_group_drop,  # from the router: a group was given up
            Refill: self._on_refill,  # from the router: launch fresh groups
            Occupy: self._on_occupy,  # from the router: a kept group holds a slot
            BufferReady: self._on_ready,  # from the router: a buffer is full
            RouterStatus: self._on_router_status,
            InstanceStatus: self._on_instance_status,
            WeightsPublished: self._on_published,
            WeightsLoaded: self._on_loaded,
            InstanceSyncFailed: self._on_sync_failed,
            ActorExited: self._on_exited,
            ScaleDecided: self._on_scaled,  # from the supervisor: instances removed (psrl scale) or lost for good
            TrainerProgress: self._on_progress,
            MemorySwitched: self._on_switched,
            EvalResult: self._on_eval_result,
        }

    def timers(self) -> list[Timer]:
        return [Timer("tick", self.sync_settings.check_interval_in_ms / 1000, self.tick)]

    def start(self, now: float) -> list[Effect]:
        """The first prompt groups (the run's clock starts now)."""
        self.started = self.rate.started = now
        self._dispatch()
        if self.switch is not None:
            self._switch(self.switch.start(now))
        return self.take()

    # ------------------------------------------------------------------ dispatch

    @property
    def awaits_first_version(self) -> bool:
        """A resumed run's trainer re-pushes its checkpoint's version: nothing is dispatched until it is published."""
        return self.ps_version < self.initial_version

    def _dispatch(self) -> None:
        if self.is_finished or self.awaits_first_version:
            return
        cfg = self.config
        allowance = dispatch_allowance(
            ps_version=self.ps_version,
            initial_version=self.initial_version,
            staleness=cfg.psrl.staleness,
            max_dispatch_ahead=cfg.psrl.max_dispatch_ahead,
            groups_per_buffer=cfg.entries_per_buffer,
            num_dispatched=self.book.num_dispatched,
        )
        for _ in range(allowance):
            self._open_group(is_replacement=False)

    def _open_group(self, *, is_replacement: bool) -> None:
        prompt = self.prompts.prompt(self.book.next_prompt_id)
        ids = self.prompts.token_ids(prompt)
        group = self.book.open(prompt, ids, is_replacement=is_replacement)
        for rid in self.book.request_ids(group.prompt_id):
            request = GenerateRequest(
                request_id=rid,
                prompt_id=group.prompt_id,
                prompt_token_ids=ids,
                sampling=self.prompts.sampling(rid, len(ids)),
            )
            self.send(ROUTER, request, request_id=rid, prompt_id=group.prompt_id)

    def _on_refill(self, refill: Refill, now: float) -> None:
        for prompt_id in refill.prompt_ids:
            self.book.drop(prompt_id)
        if refill.reason == "failed" and not self.config.psrl.agentic_rl.manager_retry_on_error:
            reason = f"prompt groups {refill.prompt_ids} failed (psrl.agentic_rl.manager_retry_on_error=False)"
            self.is_finished = True
            self.publish(RunFinished(success=False, reason=reason))
            return
        for _ in range(refill.num_groups):
            self._open_group(is_replacement=True)

    # ------------------------------------------------------------------ results and groups

    def _on_done(self, done: TrajectoryDone, now: float) -> None:
        group = self.book.groups.get(done.prompt_id)
        if group is not None and done.request_id in group.results:
            self._duplicate("trajectory", done.prompt_id, request_id=done.request_id)
            return
        reward = None
        if is_success(done):
            if group is None:
                return
            if done.env_reward is not None:  # a session: its environment scored it
                reward = Reward(score=done.env_reward, acc=done.env_acc if done.env_acc is not None else 0.0)
            else:
                reward = self.scorer.score(group.prompt, done.token_ids)
            self.response_lengths.append(len(done.token_ids))
            self.rate.add(now, len(done.token_ids))
        elif done.finish_reason == FinishReason.ERROR:
            self.failures.failed(done.error)
        self.book.record(done, reward)
        if group is not None and group.waiting is not None and group.has_all_winners:
            finished, group.waiting = group.waiting, None
            self._on_group_finished(finished, now)

    def _on_group_finished(self, finished: GroupFinished, now: float) -> None:
        known = self.book.groups.get(finished.prompt_id)
        if known is not None and known.is_settled:
            self._duplicate("group finished", finished.prompt_id)
            return
        group = self.book.complete(finished.prompt_id, list(finished.request_ids))
        if group is None or not group.has_all_winners:
            if group is not None:  # the missing results are on their way (a restarted router re-sends them)
                group.waiting = finished
            if self.log is not None:
                self.log.warning("group finished without its results", prompt_id=finished.prompt_id)
            return
        group.is_settled = True
        if finished.occupied_buffer >= 0:  # already occupied (proactive truncate): nothing to ask for
            return
        if self.config.algorithm.filter_groups.enable and not has_learning_signal(group):
            self.send(ROUTER, GroupDrop(prompt_id=group.prompt_id, reason="filtered"), prompt_id=group.prompt_id)
            self.book.drop(group.prompt_id)
            self._open_group(is_replacement=True)
            return
        self.send(
            ROUTER, GroupAccept(prompt_id=group.prompt_id, request_ids=list(group.winners)), prompt_id=group.prompt_id
        )

    def _duplicate(self, what: str, prompt_id: int, **ids: int) -> None:
        """A router message the coordinator already took (delivered again by a restarted router): once only."""
        self.num_duplicates += 1
        if self.log is not None:
            self.log.info(f"{what} already received", prompt_id=prompt_id, **ids)

    def _on_group_drop(self, drop: GroupDrop, now: float) -> None:
        self.book.drop(drop.prompt_id)

    def _on_occupy(self, occupy: Occupy, now: float) -> None:
        group = self.book.groups.get(occupy.prompt_id)
        if group is None:
            return
        previous = group.buffer
        group.buffer = occupy.buffer
        if previous is not None and previous != occupy.buffer:  # moved by the proactive filter
            chunks = self.emitter.on_moved(occupy.prompt_id, previous, occupy.buffer)
        else:
            chunks = self.emitter.on_occupied(occupy.buffer, occupy.prompt_id)
        self._hand_over(chunks, now)

    def _on_ready(self, ready: BufferReady, now: float) -> None:
        self._hand_over(self.emitter.on_ready(ready.buffer, list(ready.prompt_ids)), now)

    # ------------------------------------------------------------------ buffers to the trainer

    def _hand_over(self, chunks: list[Chunk], now: float) -> None:
        while chunks:
            for chunk in chunks:
                self._send_chunk(chunk, now)
            chunks = []
            if self.emitter.is_current_done():
                buffer = self.emitter.current
                self.send(ROUTER, Consume(buffer=buffer, trainer_version=buffer))
                chunks = self.emitter.advance()

    def _send_chunk(self, chunk: Chunk, now: float) -> None:
        groups = self.book.take(list(chunk.prompt_ids))
        data = train_data(chunk, groups, with_logprobs=self.config.psrl.log_prob.enable_rollout_engine_log_prob)
        for trainer in self.trainers:
            self.send(trainer, data, model_version=chunk.buffer)
        self.unacknowledged.setdefault(chunk.buffer, []).append(data)
        self.handed_over.append(data)
        if self.switch is not None:
            self._switch(self.switch.handed_over(chunk.buffer, now))
        if chunk.is_last:
            self._buffer_metrics(chunk, self.handed_over, now)
            self.handed_over = []

    def _buffer_metrics(self, chunk: Chunk, parts: list[TrainData], now: float) -> None:
        rewards = np.concatenate([d.rewards for d in parts])
        accs = np.concatenate([d.accs for d in parts])
        lengths = np.concatenate([d.response_lengths for d in parts])
        staleness = chunk.buffer - np.concatenate([d.v_traj for d in parts])
        prompt_ids = [int(p) for d in parts for p in dict.fromkeys(d.prompt_ids.tolist())]
        batch = TrainBatch(
            step=chunk.buffer + 1,
            buffer=chunk.buffer,
            prompt_ids=prompt_ids,
            num_trajectories=len(rewards),
            num_tokens=int(lengths.sum()),
            min_version=int(chunk.buffer - staleness.max()) if len(staleness) else -1,
        )
        self.publish(batch, model_version=chunk.buffer)
        trajectories_per_s, tokens_per_s = self.rate.rates(now)
        failed, notes = self.failures.take()
        values = {
            "reward/mean": _mean(rewards),
            "acc/mean": _mean(accs),
            "response_length/mean": _mean(lengths),
            "staleness/mean": _mean(staleness),
            "staleness/max": float(staleness.max()) if len(staleness) else 0.0,
            "throughput/trajectories_per_s": trajectories_per_s,
            "throughput/tokens_per_s": tokens_per_s,
            **self.scorer.take_metrics(),
            **failed,
        }
        if first_reward_error := self.scorer.take_first_error():
            notes["reward/first_error"] = first_reward_error
        self.reward_history.append((chunk.buffer + 1, values["reward/mean"]))
        self.publish(Metrics(step=chunk.buffer + 1, values=values, notes=notes), model_version=chunk.buffer)
        self._stop_if_rewards_fail(values, notes.get("reward/first_error", ""))

    def _stop_if_rewards_fail(self, values: dict[str, float], first_error: str) -> None:
        """End the run (as failed; the trainer checkpoints on the way out) once reward calls failed on too
        many steps in a row: training on reward.error_score would only waste the run."""
        step = step_failures(values)
        if not self.reward_watch.observe(step) or self.is_finished:
            return
        self.is_finished = True
        reason = stop_reason(self.reward_watch, step, first_error)
        if self.log is not None:
            self.log.error("stopping the run: reward calls keep failing", reason=reason)
        self.publish(RunFinished(success=False, reason=reason))

    # ------------------------------------------------------------------ instances and versions

    def _on_router_status(self, status: RouterStatus, now: float) -> None:
        counts = zip(status.versions, status.servable_without_new_entry, status.servable_with_new_entry, strict=True)
        self.router_facts = RouterFacts({v: ServableCounts(v, a, b) for v, a, b in counts})

    def _on_instance_status(self, status: InstanceStatus, now: float) -> None:
        self.instances.report(snapshot_from_status(status))
        if self.switch is not None and status.instance not in self.switch.members[ROLLOUT]:
            self._switch(self.switch.rejoined(status.instance, ROLLOUT, now))  # a restarted instance
        planner = self.evaluation
        if planner is not None and not status.is_paused and planner.is_due(status.weight_version):
            request = planner.start(status.instance, status.weight_version, now)
            self.publish(request, model_version=status.weight_version)

    def _on_published(self, published: WeightsPublished, now: float) -> None:
        if published.version > self.ps_version:
            self.ps_version = published.version
            self.version_times.append(now)
            # decide now whether instances sync to it, not at the next tick (up to a tick of every version);
            # colocated, the switch hands the GPUs over on its own schedule, and syncs go with it. Before the
            # new requests: effects go out in order, and a synchronous step waits for the instances' load,
            # not for a buffer's worth of requests to be sent first
            if self.switch is None:
                self._decide(now)
            self._dispatch()

    def _on_loaded(self, loaded: WeightsLoaded, now: float) -> None:
        self.instances.loaded(loaded.instance, loaded.version, loaded.load_ms / 1000)

    def _on_sync_failed(self, failed: InstanceSyncFailed, now: float) -> None:
        self.instances.sync_failed(failed.instance)

    def _on_exited(self, exited: ActorExited, now: float) -> None:
        self.instances.remove(exited.actor)
        if exited.actor in self.trainers:
            self._resend(exited.actor)
        if self.switch is not None:
            self._switch(self.switch.exited(exited.actor, now))
        if self.evaluation is not None and self.evaluation.abandon(exited.actor) and self.log is not None:
            self.log.warning("evaluation round lost with its instance; it starts again", instance=exited.actor)

    def _on_scaled(self, decided: ScaleDecided, now: float) -> None:
        if decided.error:
            return
        for name in decided.removed:
            self.instances.retire(name)
            if self.evaluation is not None and self.evaluation.abandon(name) and self.log is not None:
                self.log.warning("evaluation round moved off a retiring instance", instance=name)

    def _resend(self, trainer: str) -> None:
        """Hand a lost rank's replacement every chunk not yet trained (the link delivers them once it
        binds); chunks the dead rank never received are among them, so no buffer is lost."""
        buffers = sorted(self.unacknowledged)
        if self.log is not None:
            self.log.warning("re-sending buffers to a restarted trainer", trainer=trainer, buffers=buffers)
        for buffer in buffers:
            for data in self.unacknowledged[buffer]:
                self.send(trainer, data, model_version=buffer)

    # ------------------------------------------------------------------ colocation

    def _on_switched(self, switched: MemorySwitched, now: float) -> None:
        if self.switch is not None:
            self._switch(self.switch.switched(switched.actor, switched.action, now))

    def _switch(self, commands: list[SwitchCommand]) -> None:
        """The switch's commands on the control channel, and the time each completed switch waited for its pause."""
        switch = self.switch
        if switch is None:
            return
        for command in commands:
            kind = MemoryPause if command.action == "pause" else MemoryResume
            self.publish(kind(targets=list(command.targets), reason=command.reason))
        while switch.completed:
            done = switch.completed.pop(0)
            self.publish(Metrics(step=switch.trained, values={f"tms/switch_to_{done.to_side}_ms": done.pause_wait_ms}))

    def _on_eval_result(self, result: EvalResult, now: float) -> None:
        if self.evaluation is None:
            return
        values = self.evaluation.record(result, now)
        if values is not None:
            version = int(values["eval/version"])
            self.publish(Metrics(step=version, values=values), model_version=version)
            self._finish_if_done(now)

    # ------------------------------------------------------------------ ticks

    def tick(self, now: float) -> list[Effect]:
        """One sync/migration decision from what the coordinator knows now."""
        self._decide(now)
        return self.take()

    def _decide(self, now: float) -> None:
        if self.is_finished:
            return
        if self.switch is not None:
            self._switch(self.switch.retry(now))
        self._finish_if_done(now)
        inputs = self._tick_inputs(now)
        decision = decide_tick(inputs, self.sync_policy, self.sync_settings)
        synced = list(decision.sync.instance_ids)
        if synced:
            partial = self.config.psrl.rollout_coordination.partial_rollout.enable
            command = SyncCommand(
                instances=synced, version=inputs.ps_version, abort_running=partial, strategy=self.sync_settings.method
            )
            self.publish(command, model_version=inputs.ps_version)
            for instance in synced:
                self.instances.sync_started(instance, now)
        mig = decision.migration
        if mig is not None:
            self.publish(
                MigrateCommand(
                    source=mig.source_id,
                    target=mig.starved_id,
                    request_ids=[],
                    reason=f"ratio={mig.ratio:.2f}",
                    num_requests=mig.num_to_move or 0,
                )
            )
        if self.record_decisions:
            changed = not (self.last_tick_inputs and same_situation(inputs, self.last_tick_inputs))
            if synced or mig is not None or changed:
                record = TickRecord(
                    synced=synced, migrated=mig.source_id if mig else "", record=encode_tick(inputs, decision)
                )
                self.publish(record)
            self.last_tick_inputs = inputs

    def _tick_inputs(self, now: float) -> CoordinationInputs:
        times = list(self.version_times)
        interval = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        task = self.config.task
        lengths = self.response_lengths
        mean_response = float(np.mean(lengths)) if lengths else float(task.max_response_length) / 2
        return CoordinationInputs(
            now=now,
            ps_version=self.ps_version,
            instances=self.instances.states(),
            router=self.router_facts,
            mean_version_interval_s=interval,
            mean_prompt_tokens=float(task.max_prompt_length) / 2,
            mean_response_tokens=mean_response,
        )

    # ------------------------------------------------------------------ the end

    def _on_progress(self, progress: TrainerProgress, now: float) -> None:
        for buffer in [b for b in self.unacknowledged if b < progress.version]:
            del self.unacknowledged[buffer]
        if self.switch is not None and progress.step < self.config.trainer.total_steps:
            self._switch(self.switch.trained_version(progress.version, now))
        if progress.step >= self.config.trainer.total_steps and self.final_progress is None:
            self.final_progress = progress
            self.final_since = now
            self._finish_if_done(now)

    def _finish_if_done(self, now: float) -> None:
        """End the run after the last step, once the last version is evaluated (or waiting has timed out)."""
        progress = self.final_progress
        if progress is None or self.is_finished:
            return
        planner = self.evaluation
        if planner is not None and not planner.is_last_measured:
            if now - self.final_since < self.config.eval.final_timeout_s:
                return
            if self.log is not None:
                self.log.warning("last version not evaluated in time", timeout_s=self.config.eval.final_timeout_s)
        self.is_finished = True
        summary = {"steps": float(progress.step), "elapsed_s": self.final_since - self.started}
        if self.reward_history:
            summary["reward_first"] = self.reward_history[0][1]
            summary["reward_last"] = self.reward_history[-1][1]
        self.publish(RunFinished(success=True, reason=f"{progress.step} training steps done", summary=summary))


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else 0.0
