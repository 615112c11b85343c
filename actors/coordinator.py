"""The coordinator: dataset and prompt groups, rewards, buffers to the trainer, sync and migration.

dispatch   prompt groups (N' requests each) go to the router within the dispatch throttle
results    finished trajectories are decoded and scored; when the router reports a group's
           first N finished, the group is filtered or kept (the router occupies its slot)
buffers    occupied groups are released to the trainer chunk by chunk (fine-grain overlap)
           in occupancy order; a fully handed-over buffer is consumed in the ledger
tick       every check interval: the sync strategy, then migration (`psrl.coordination`),
           from instance reports, the router's facts and the PS version; logged for replay
end        after `trainer.total_steps` versions the coordinator ends the run (RunFinished)
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from actors.base import Actor, handles
from actors.links import Link
from actors.status import snapshot_from_status
from bus.messages import (
    ActorExited,
    BufferReady,
    Consume,
    GenerateRequest,
    GenerateResult,
    GroupComplete,
    GroupDrop,
    InstanceStatus,
    InstanceSyncFailed,
    Metrics,
    MigrateCommand,
    Occupy,
    Refill,
    RouterStatus,
    RunFinished,
    SamplingParams,
    SyncCommand,
    TickRecord,
    TrainBatch,
    TrainData,
    TrainerProgress,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Event
from psrl.config.rules import chunk_plan
from psrl.coordination.chunks import Chunk, ChunkEmitter
from psrl.coordination.groups import Group, GroupBook, has_learning_signal, is_success
from psrl.coordination.instances import InstanceBook
from psrl.coordination.lengths import forced_length
from psrl.coordination.records import encode_tick, same_situation
from psrl.coordination.state import CoordinationInputs, RouterFacts
from psrl.coordination.sync import SyncPolicy
from psrl.coordination.tick import decide_tick
from psrl.data import make_task
from psrl.engine.args import DEMO_MODEL_DIR
from psrl.rewards.factory import make_scorer
from psrl.routing.cost_model import load_cost_model
from psrl.routing.servable import ServableCounts
from psrl.staleness.throttle import dispatch_allowance

ROUTER = "router"


class CoordinatorActor(Actor):
    ROLE = "coordinator"

    def setup(self) -> dict[str, int]:
        cfg = self.config
        model_dir = cfg.model.tokenizer_path or cfg.model.path or str(DEMO_MODEL_DIR)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.task = make_task(cfg, self.tokenizer)  # data.train_files, or the task's prompt generator
        self.scorer = make_scorer(cfg, self.task)  # reward.function, or the task's reward
        self.n = cfg.responses_per_prompt
        self.initial_version = int(self.boot.options.get("initial_version", 0))
        self.book = GroupBook(self.n, first_prompt_id=int(self.boot.options.get("first_prompt_id", 0)))
        plan = chunk_plan(cfg)
        self.emitter = ChunkEmitter(plan.chunk_groups, cfg.psrl.staleness_buffer_entries, self.initial_version)
        self.instances = InstanceBook()
        rc = cfg.psrl.rollout_coordination
        cost = load_cost_model(rc.routing_strategy.cost_model_path) if rc.routing_strategy.cost_model_path else None
        self.sync_settings = rc.sync_and_mig_strategy
        max_seqs = rc.routing_strategy.max_concurrent_seqs_per_instance
        self.sync_policy = SyncPolicy(self.sync_settings, partial_rollout=rc.partial_rollout.enable, cost_model=cost,
                                      max_concurrent_seqs=max_seqs)  # fmt: skip
        self.router = self._link(ROUTER)
        self.trainers = [self._link(f"trainer-{r}") for r in range(cfg.topology.n_trainer_ranks)]
        self.ps_version = self.initial_version if self.initial_version == 0 else -1  # a resumed trainer re-pushes
        self.version_times: deque[float] = deque(maxlen=8)
        self.router_facts = RouterFacts()
        self.last_tick_inputs: CoordinationInputs | None = None
        self.response_lengths: deque[int] = deque(maxlen=256)
        self.reward_history: list[tuple[int, float]] = []
        self.started = time.monotonic()
        self.last_handoff = time.monotonic()
        self.is_finished = False
        self.handed_over: list[TrainData] = []
        self.every(self.sync_settings.check_interval_in_ms / 1000, self._tick)
        return {}

    def _link(self, peer: str) -> Link:
        link = Link(self.ctx, self.boot.endpoint(peer), sender=f"{self.name}-{peer}", incarnation=self.boot.incarnation,
                    settings=self.bus, serve=False, identity=self.name)  # fmt: skip
        self.add_input(link.socket, lambda: self._on_link(link))
        return link

    def _on_link(self, link: Link) -> None:
        received = link.recv()
        if received is not None:
            for event in received[1]:
                self.dispatch(event)

    # ------------------------------------------------------------------ dispatch

    def step(self) -> bool:
        if self.is_finished or self.ps_version < self.initial_version:
            return False
        allowance = dispatch_allowance(
            ps_version=self.ps_version, initial_version=self.initial_version, staleness=self.config.psrl.staleness,
            max_dispatch_ahead=self.config.psrl.max_dispatch_ahead, groups_per_buffer=self.config.entries_per_buffer,
            num_dispatched=self.book.num_dispatched,
        )  # fmt: skip
        for _ in range(allowance):
            self._dispatch_group(is_replacement=False)
        return False

    def _dispatch_group(self, *, is_replacement: bool) -> None:
        prompt = self.task.prompt(self.book.next_prompt_id)
        ids = np.asarray(prompt.token_ids or self.tokenizer.encode(prompt.text), np.int32)
        group = self.book.open(prompt, ids, is_replacement=is_replacement)
        task = self.config.task
        stop = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        for rid in self.book.request_ids(group.prompt_id):
            seed = (task.seed * 1_000_003 + rid) % (2**31)
            length = forced_length(task, rid)
            max_tokens = task.max_response_length if length is None else length
            sampling = SamplingParams(max_tokens, task.temperature, task.top_p, task.top_k, stop, seed,
                                      min_tokens=length or 0, ignore_eos=length is not None)  # fmt: skip
            self.router.send(GenerateRequest(rid, group.prompt_id, ids, sampling), request_id=rid,
                             prompt_id=group.prompt_id)  # fmt: skip

    @handles(Refill, link=True)
    def _on_refill(self, event: Event[Refill]) -> None:
        for prompt_id in event.message.prompt_ids:
            self.book.drop(prompt_id)
        if event.message.reason == "failed" and not self.config.psrl.agentic_rl.manager_retry_on_error:
            reason = f"prompt groups {event.message.prompt_ids} failed (psrl.agentic_rl.manager_retry_on_error=False)"
            self.is_finished = True
            self.publisher.publish(RunFinished(False, reason))
            return
        for _ in range(event.message.num_groups):
            self._dispatch_group(is_replacement=True)

    # ------------------------------------------------------------------ results and groups

    @handles(GenerateResult, link=True)
    def _on_result(self, event: Event[GenerateResult]) -> None:
        result = event.message
        reward = None
        if is_success(result):
            group = self.book.groups.get(result.prompt_id)
            if group is None:
                return
            text = str(self.tokenizer.decode(result.token_ids.tolist(), skip_special_tokens=True))
            reward = self.scorer.score(group.prompt, text, result.token_ids)
            self.response_lengths.append(len(result.token_ids))
        v_traj = event.envelope.model_version
        self.book.record(result, reward, -1 if v_traj is None else v_traj)

    @handles(GroupComplete, link=True)
    def _on_group_complete(self, event: Event[GroupComplete]) -> None:
        group = self.book.complete(event.message.prompt_id, list(event.message.request_ids))
        if group is None or not group.has_all_winners:
            self.log.warning("group complete without its results", prompt_id=event.message.prompt_id)
            return
        if event.message.occupied_buffer >= 0:  # already occupied (proactive truncate): nothing to ask for
            return
        if self.config.algorithm.filter_groups.enable and not has_learning_signal(group):
            self.router.send(GroupDrop(group.prompt_id, "filtered"), prompt_id=group.prompt_id)
            self.book.drop(group.prompt_id)
            self._dispatch_group(is_replacement=True)
            return
        self.router.send(GroupComplete(group.prompt_id, list(group.winners)), prompt_id=group.prompt_id)

    @handles(GroupDrop, link=True)
    def _on_group_drop(self, event: Event[GroupDrop]) -> None:
        self.book.drop(event.message.prompt_id)

    @handles(Occupy, link=True)
    def _on_occupy(self, event: Event[Occupy]) -> None:
        occ = event.message
        group = self.book.groups.get(occ.prompt_id)
        if group is None:
            return
        moved = group.buffer is not None and group.buffer != occ.buffer
        previous = group.buffer
        group.buffer = occ.buffer
        chunks = (self.emitter.on_moved(occ.prompt_id, previous, occ.buffer) if moved and previous is not None
                  else self.emitter.on_occupied(occ.buffer, occ.prompt_id))  # fmt: skip
        self._hand_over(chunks)

    @handles(BufferReady, link=True)
    def _on_ready(self, event: Event[BufferReady]) -> None:
        self._hand_over(self.emitter.on_ready(event.message.buffer, list(event.message.prompt_ids)))

    def _hand_over(self, chunks: list[Chunk]) -> None:
        while chunks:
            for chunk in chunks:
                self._send_chunk(chunk)
            chunks = []
            if self.emitter.is_current_done():
                buffer = self.emitter.current
                self.router.send(Consume(buffer, buffer))
                chunks = self.emitter.advance()

    def _send_chunk(self, chunk: Chunk) -> None:
        groups = self.book.take(list(chunk.prompt_ids))
        data = train_data(chunk, groups, with_logprobs=self.config.psrl.log_prob.enable_rollout_engine_log_prob)
        for trainer in self.trainers:
            trainer.send(data, model_version=chunk.buffer)
        self.handed_over.append(data)
        if chunk.is_last:
            self._publish_buffer_metrics(chunk, self.handed_over)
            self.handed_over = []

    def _publish_buffer_metrics(self, chunk: Chunk, parts: list[TrainData]) -> None:
        now = time.monotonic()
        rewards = np.concatenate([d.rewards for d in parts])
        accs = np.concatenate([d.accs for d in parts])
        lengths = np.concatenate([d.response_lengths for d in parts])
        staleness = chunk.buffer - np.concatenate([d.v_traj for d in parts])
        prompt_ids = [int(p) for d in parts for p in dict.fromkeys(d.prompt_ids.tolist())]
        self.publisher.publish(TrainBatch(chunk.buffer + 1, chunk.buffer, prompt_ids, len(rewards), int(lengths.sum()),
                                          int(chunk.buffer - staleness.max()) if len(staleness) else -1),
                               model_version=chunk.buffer)  # fmt: skip
        elapsed = max(now - self.last_handoff, 1e-6)
        values = {
            "reward/mean": float(rewards.mean()) if len(rewards) else 0.0,
            "acc/mean": float(accs.mean()) if len(accs) else 0.0,
            "response_length/mean": float(lengths.mean()) if len(lengths) else 0.0,
            "staleness/mean": float(staleness.mean()) if len(staleness) else 0.0,
            "staleness/max": float(staleness.max()) if len(staleness) else 0.0,
            "throughput/trajectories_per_s": len(rewards) / elapsed,
            "throughput/tokens_per_s": float(lengths.sum()) / elapsed,
            "data/truncated_prompts": float(getattr(self.task, "num_truncated", 0)),
            **self.scorer.take_metrics(),
        }
        self.last_handoff = now
        self.reward_history.append((chunk.buffer + 1, values["reward/mean"]))
        self.publisher.publish(Metrics(chunk.buffer + 1, values), model_version=chunk.buffer)

    # ------------------------------------------------------------------ instances, versions, ticks

    @handles(RouterStatus, link=True)
    def _on_router_status(self, event: Event[RouterStatus]) -> None:
        s = event.message
        servable = {v: ServableCounts(v, a, b) for v, a, b in
                    zip(s.versions, s.servable_without_new_entry, s.servable_with_new_entry, strict=True)}  # fmt: skip
        self.router_facts = RouterFacts(servable)

    @handles(InstanceStatus)
    def _on_instance_status(self, event: Event[InstanceStatus]) -> None:
        s = event.message
        self.instances.report(snapshot_from_status(s))

    @handles(WeightsPublished)
    def _on_published(self, event: Event[WeightsPublished]) -> None:
        if event.message.version > self.ps_version:
            self.ps_version = event.message.version
            self.version_times.append(time.monotonic())

    @handles(WeightsLoaded)
    def _on_loaded(self, event: Event[WeightsLoaded]) -> None:
        msg = event.message
        self.instances.loaded(msg.instance, msg.version, msg.load_ms / 1000)

    @handles(InstanceSyncFailed)
    def _on_sync_failed(self, event: Event[InstanceSyncFailed]) -> None:
        self.instances.sync_failed(event.message.instance)

    @handles(ActorExited)
    def _on_exited(self, event: Event[ActorExited]) -> None:
        self.instances.remove(event.message.actor)

    def _tick(self) -> None:
        if self.is_finished:
            return
        inputs = self._tick_inputs()
        decision = decide_tick(inputs, self.sync_policy, self.sync_settings)
        synced = list(decision.sync.instance_ids)
        if synced:
            partial = self.config.psrl.rollout_coordination.partial_rollout.enable
            self.publisher.publish(SyncCommand(synced, inputs.ps_version, partial, self.sync_settings.method),
                                   model_version=inputs.ps_version)  # fmt: skip
            for instance in synced:
                self.instances.sync_started(instance, inputs.now)
        mig = decision.migration
        if mig is not None:
            self.publisher.publish(MigrateCommand(mig.source_id, mig.starved_id, [], f"ratio={mig.ratio:.2f}",
                                                  mig.num_to_move or 0))  # fmt: skip
        if synced or mig is not None or not (self.last_tick_inputs and same_situation(inputs, self.last_tick_inputs)):
            self.publisher.publish(TickRecord(synced, mig.source_id if mig else "", encode_tick(inputs, decision)))
        self.last_tick_inputs = inputs

    def _tick_inputs(self) -> CoordinationInputs:
        times = list(self.version_times)
        interval = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        lengths = self.response_lengths
        mean_response = float(np.mean(lengths)) if lengths else float(self.config.task.max_response_length) / 2
        return CoordinationInputs(
            now=time.monotonic(), ps_version=self.ps_version, instances=self.instances.states(),
            router=self.router_facts, mean_version_interval_s=interval,
            mean_prompt_tokens=float(self.config.task.max_prompt_length) / 2,
            mean_response_tokens=mean_response,
        )  # fmt: skip

    # ------------------------------------------------------------------ the end

    @handles(TrainerProgress)
    def _on_progress(self, event: Event[TrainerProgress]) -> None:
        if event.message.step >= self.config.trainer.total_steps and not self.is_finished:
            self.is_finished = True
            summary = {"steps": float(event.message.step), "elapsed_s": time.monotonic() - self.started}
            if self.reward_history:
                summary["reward_first"] = self.reward_history[0][1]
                summary["reward_last"] = self.reward_history[-1][1]
            self.publisher.publish(RunFinished(True, f"{event.message.step} training steps done", summary))

    def teardown(self) -> None:
        if hasattr(self, "scorer"):
            self.scorer.close()
        for link in [getattr(self, "router", None), *getattr(self, "trainers", [])]:
            if link is not None:
                link.close()


def train_data(chunk: Chunk, groups: list[Group], *, with_logprobs: bool = True) -> TrainData:
    """Flatten the kept trajectories of ``groups`` into one TrainData message (engine log-probs only
    when the run uses them)."""
    rows: list[tuple[Group, GenerateResult, Any]] = [(g, r, w) for g in groups for r, w in g.kept_results()]
    i32, f32 = np.int32, np.float32

    def cat(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)

    return TrainData(
        step=chunk.buffer + 1, buffer=chunk.buffer, chunk=chunk.index, num_chunks=chunk.num_chunks,
        prompt_ids=np.asarray([g.prompt_id for g, _, _ in rows], i32),
        request_ids=np.asarray([r.request_id for _, r, _ in rows], i32),
        v_traj=np.asarray([g.v_traj.get(r.request_id, -1) for g, r, _ in rows], i32),
        prompt_lengths=np.asarray([len(g.prompt_token_ids) for g, _, _ in rows], i32),
        response_lengths=np.asarray([len(r.token_ids) for _, r, _ in rows], i32),
        prompt_token_ids=cat([g.prompt_token_ids for g, _, _ in rows], i32),
        response_token_ids=cat([r.token_ids for _, r, _ in rows], i32),
        response_logprobs=cat([r.logprobs for _, r, _ in rows], f32) if with_logprobs else np.zeros(0, f32),
        response_versions=cat([r.versions for _, r, _ in rows], i32),
        rewards=np.asarray([w.score for _, _, w in rows], f32),
        accs=np.asarray([w.acc for _, _, w in rows], f32),
        finish_reasons=np.asarray([int(r.finish_reason) for _, r, _ in rows], i32),
    )  # fmt: skip
