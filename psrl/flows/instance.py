"""A rollout instance's algorithm around its engine: serve requests, stream tokens, sync weights.

Requests arrive from the router (``GenerateRequest``); generated tokens stream back in
``TokenBatch`` messages (one per engine step, for all its requests) and each request ends with
one ``GenerateResult``. An interrupted request's result says why (``error`` = sync / migrate /
preempted / shutdown) so the router knows whether to continue it elsewhere. Held-out evaluation
requests (``EvalRequest``) come from the coordinator on the bus and are answered on the bus
(``EvalResult``); they never reach the router and are never interrupted: a due sync waits for
them, so each answer comes from one version. Commands come from the coordinator: ``SyncCommand``
(pull the version, load it; under partial rollout interrupt the running requests once the
version's bytes have arrived, otherwise let them finish first), ``MigrateCommand`` (hand the
newest requests back so the router places them elsewhere) and, when colocated, ``MemoryPause`` /
``MemoryResume``. Status snapshots go to the router and to everyone on the bus.

The engine and the weight supply are this flow's ports: the rollout actor gives it the embedded
engine and the parameter server (``psrl.ps.supply``), the in-process driver a trainer's weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from bus.messages import (
    Abort,
    EvalRequest,
    EvalResult,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InstanceStatus,
    InstanceSyncFailed,
    MemoryPause,
    MemoryResume,
    MigrateCommand,
    PullRequest,
    SyncCommand,
    TokenBatch,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Message
from psrl.config import Config
from psrl.engine.outputs import RequestResult
from psrl.engine.protocol import RolloutEngine
from psrl.errors import RequestError
from psrl.flows.base import Flow
from psrl.flows.effects import Effect, Handler, Timer
from psrl.flows.instance_kv import InstanceKv, KvPort
from psrl.flows.memory import MemorySwitcher
from psrl.ps import PullFailedError
from psrl.ps.supply import Fetched
from psrl.routing.budget import budget_request_tokens
from psrl.routing.preemption import preempted_to_loop_back
from psrl.tms import SwitchReport

ROUTER = "router"
EVAL_PREFIX = "eval:"  # engine request ids of evaluation samples: eval:<round>:<sample>
STREAM_EVERY_TOKENS = 16  # chunk size of token streaming (a dead instance loses at most this much)
_PULL_ERRORS = (PullFailedError, ValueError, RuntimeError)


@runtime_checkable
class ReleasableEngine(Protocol):
    """An engine whose GPU memory can be released and re-acquired (the embedded engine; ``psrl.tms``)."""

    def release_memory(self) -> SwitchReport: ...

    def restore_memory(self) -> SwitchReport: ...


class WeightSupply(Protocol):
    def prefetch(self, version: int) -> None:
        """A version was published: start getting it in the background (or do nothing)."""
        ...

    def is_arriving(self, version: int) -> bool:
        """``version`` is being got in the background right now."""
        ...

    def fetch(self, version: int) -> Fetched:
        """Every tensor of ``version`` (or a newer one); raises PullFailedError / ValueError / RuntimeError."""
        ...


@dataclass
class _Stream:
    """Tokens of one request not yet sent to the router."""

    prompt_id: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _PendingSync:
    version: int
    abort_running: bool


class InstanceFlow(Flow):
    BUS_KINDS = (SyncCommand, MigrateCommand, WeightsPublished, EvalRequest, MemoryPause, MemoryResume)

    def __init__(
        self,
        name: str,
        config: Config,
        engine: RolloutEngine,
        weights: WeightSupply,
        *,
        clock: Callable[[], float] = time.monotonic,
        log: Any = None,
        kv: KvPort | None = None,
    ) -> None:
        """``kv``: the offload tier and KV transfer (psrl.lmcache); None without them."""
        super().__init__()
        self.name = name
        self.engine = engine
        self.weights = weights
        self.clock = clock  # measures how long a sync stops the instance
        self.log = log
        self.routing = config.psrl.rollout_coordination.routing_strategy
        self.status_collection = config.psrl.status_collection
        self.streams: dict[str, _Stream] = {}
        self.evals: dict[str, tuple[int, int]] = {}  # engine id -> (round, sample) of evaluation samples
        self.pending_sync: _PendingSync | None = None
        self.last_dispatch_seq = -1
        self.report_seq = 0
        self.kv = None if kv is None else InstanceKv(name, kv, self.routing.kv_transfer, engine)
        self.memory = MemorySwitcher(name, self._release_memory, self._restore_memory)

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            GenerateRequest: self._on_generate,  # from the router
            Abort: self._on_abort,  # from the router
            SyncCommand: self._on_sync,
            MigrateCommand: self._on_migrate,
            WeightsPublished: self._on_published,
            MemoryPause: self._on_memory_pause,  # colocation: the trainer takes the GPUs
            MemoryResume: self._on_memory_resume,  # colocation: rollout's turn
            EvalRequest: self._on_eval,
        }

    def timers(self) -> list[Timer]:
        if not self.status_collection.enable:
            return []
        return [Timer("status", self.status_collection.engine_sync_interval_in_ms / 1000, self.status)]

    def start(self, now: float, *, committed_version: int = -1) -> list[Effect]:
        """One status report, always: it is how the router learns the instance exists.

        A replacement joins a run that is ahead of the initial weights: given the version the
        parameter server has committed, it loads that version first, so a request continued here
        never runs on older weights than the tokens it already holds."""
        if committed_version > self.engine.weight_version:
            self._sync(committed_version)
        return self.status(now)

    @property
    def num_inflight(self) -> int:
        return len(self.streams)

    # ------------------------------------------------------------------ requests

    def _on_generate(self, req: GenerateRequest, now: float) -> None:
        if self.kv is not None and self.kv.wants_fetch(req):
            tokens = req.prompt_token_ids.tolist()
            if req.generated_token_ids is not None:
                tokens += req.generated_token_ids.tolist()
            if self.kv.start_fetch(req, tokens, now):  # sync / pin_sync: added when the fetch ends
                self.last_dispatch_seq = max(self.last_dispatch_seq, req.dispatch_seq)
                return
            self._admit(req)
            self.kv.admitted_while_fetching(str(req.request_id))  # async: prefill takes what lands
            return
        self._admit(req)

    def _admit(self, req: GenerateRequest) -> None:
        rid = str(req.request_id)
        try:
            self.engine.add_request(
                rid,
                req.prompt_token_ids.tolist(),
                msgspec.structs.asdict(req.sampling),
                prior_output_ids=None if req.generated_token_ids is None else req.generated_token_ids.tolist(),
                prior_logprobs=None if req.generated_logprobs is None else req.generated_logprobs.tolist(),
                prior_versions=None if req.generated_versions is None else req.generated_versions.tolist(),
            )
        except RequestError as exc:
            self._send_error(req, str(exc.reason))
            return
        self.streams[rid] = _Stream(req.prompt_id)
        self.last_dispatch_seq = max(self.last_dispatch_seq, req.dispatch_seq)

    def _on_eval(self, request: EvalRequest, now: float) -> None:
        if request.instance != self.name:
            return
        offsets = np.concatenate([[0], np.cumsum(request.prompt_lengths)])
        for i, (sample_id, sampling) in enumerate(zip(request.sample_ids, request.sampling, strict=True)):
            rid = f"{EVAL_PREFIX}{request.round}:{sample_id}"
            prompt = request.prompt_token_ids[offsets[i] : offsets[i + 1]].tolist()
            try:
                self.engine.add_request(rid, prompt, msgspec.structs.asdict(sampling))
            except RequestError as exc:
                self._publish_eval(request.round, sample_id, None, str(exc.reason))
                continue
            self.evals[rid] = (request.round, sample_id)

    def _publish_eval(self, round_number: int, sample_id: int, result: RequestResult | None, error: str = "") -> None:
        versions = set(result.versions) if result is not None else set()
        message = EvalResult(
            instance=self.name,
            round=round_number,
            sample_id=sample_id,
            token_ids=np.asarray(result.output_ids if result is not None else [], np.int32),
            version=max(versions) if versions else (self.engine.weight_version if result is not None else -1),
            finish_reason=result.finish_reason if result is not None else FinishReason.ERROR,
            error=error if len(versions) <= 1 else f"mixed versions {sorted(versions)}",
        )
        self.publish(message, model_version=message.version)

    def _on_abort(self, abort: Abort, now: float) -> None:
        self.abort([str(r) for r in abort.request_ids], abort.reason or "requested")

    def _on_migrate(self, command: MigrateCommand, now: float) -> None:
        if command.source != self.name:
            return
        ids = [str(r) for r in command.request_ids] if command.request_ids else list(self.streams)
        if not command.request_ids and command.num_requests > 0:
            ids = ids[-command.num_requests :]  # the newest requests carry the least progress
        self.abort(ids, "migrate")

    def abort(self, request_ids: list[str], reason: str) -> None:
        for rid in request_ids:
            if self.kv is not None and (waiting := self.kv.awaiting.pop(rid, None)) is not None and waiting.waits:
                self._admit(waiting.request)  # it never started here: hand back exactly what it came with
            self._hand_back(rid, reason)

    def _hand_back(self, rid: str, reason: str) -> None:
        result = self.engine.abort(rid)
        if result is None:
            return
        if self.kv is not None:
            self.kv.exported(rid, result.prompt_ids + result.output_ids, reason, self.clock())
        self._send_result(result, reason)

    def stop(self) -> list[Effect]:
        """The instance shuts down: every request goes back to the router to continue elsewhere."""
        waiting_kv = [] if self.kv is None else list(self.kv.awaiting)
        self.abort(list(self.streams) + waiting_kv, "shutdown")
        return self.take()

    # ------------------------------------------------------------------ weights

    def _on_sync(self, command: SyncCommand, now: float) -> None:
        if self.name not in command.instances or command.version <= self.engine.weight_version:
            return
        self.pending_sync = _PendingSync(command.version, command.abort_running)
        if command.abort_running and not self.weights.is_arriving(command.version):
            self.abort(list(self.streams), "sync")

    def _on_published(self, published: WeightsPublished, now: float) -> None:
        if published.version > self.engine.weight_version:
            self.weights.prefetch(published.version)

    def _sync_if_due(self, now: float) -> bool:
        """Pull and load the pending version once no request holds the old weights.

        Under partial rollout the requests are interrupted here, once the version's bytes have
        arrived (until then they keep generating: the wait becomes generation time).
        """
        sync = self.pending_sync
        if sync is None:
            return False
        if sync.abort_running and self.streams:
            if self.weights.is_arriving(sync.version):
                return False
            self.abort(list(self.streams), "sync")
        if self.engine.has_unfinished_requests():
            return False
        self.pending_sync = None
        self._sync(sync.version)
        return True

    def _sync(self, version: int) -> None:
        """Pull every tensor first and load them in one step: a failed pull leaves the old weights intact."""
        self.engine.pause()
        self.publish(PullRequest(instance=self.name, version=version), model_version=version)
        started = self.clock()
        try:
            fetched = self.weights.fetch(version)
            self.engine.load_weights(fetched.tensors, fetched.version)
        except _PULL_ERRORS as exc:
            if self.log is not None:
                self.log.error("sync failed", version=version, error=str(exc))
            self.publish(InstanceSyncFailed(instance=self.name, version=version, reason=str(exc)))
            self.engine.resume()
            return
        self.engine.resume()
        loaded = WeightsLoaded(
            instance=self.name,
            version=fetched.version,
            load_ms=(self.clock() - started) * 1000,
            prefetched=fetched.prefetched,
            pull_ms=fetched.pull_ms,
        )
        self.publish(loaded, model_version=fetched.version)
        self._report_status()

    # ------------------------------------------------------------------ colocation

    def _on_memory_pause(self, command: MemoryPause, now: float) -> None:
        report = self.memory.pause(command)
        if report is not None:
            self.publish(report)
            self._report_status()

    def _on_memory_resume(self, command: MemoryResume, now: float) -> None:
        report = self.memory.resume(command)
        if report is not None:
            self.publish(report)

    def _release_memory(self) -> SwitchReport:
        return self._memory_engine().release_memory()

    def _restore_memory(self) -> SwitchReport:
        return self._memory_engine().restore_memory()

    def _memory_engine(self) -> ReleasableEngine:
        engine = self.engine
        if not isinstance(engine, ReleasableEngine):  # the config rules refuse colocation with such a backend
            raise TypeError(f"{type(engine).__name__} cannot release its GPU memory (psrl.tms)")
        return engine

    # ------------------------------------------------------------------ stepping

    def step(self, now: float) -> list[Effect]:
        """One unit of work: a due sync, or one engine step with its tokens streamed (none while released)."""
        if self.memory.is_paused:
            return []
        if self._sync_if_due(now):
            return self.take()
        if self.kv is not None:
            self._admit_fetched(now)
        if not self.engine.has_unfinished_requests():
            self.engine.capture_when_idle()  # idle time spent where a running batch would stop for it
            return []
        out = self.engine.step()
        for delta in out.outputs:
            stream = self.streams.get(delta.request_id)
            if stream is not None:
                stream.token_ids += delta.token_ids
                stream.logprobs += delta.logprobs
                stream.versions += delta.versions
        for result in out.finished:
            evaluated = self.evals.pop(result.request_id, None)
            if evaluated is not None:
                self._publish_eval(*evaluated, result)
            else:
                self._send_result(result, "")
        self._flush_streams(STREAM_EVERY_TOKENS)
        self._loop_back_preempted()
        return self.take()

    @property
    def has_work(self) -> bool:
        """Requests are unfinished, wait for their KV, or a sync waits: ``step`` has something to do
        (nothing while the instance's memory is released)."""
        if self.memory.is_paused:
            return False
        waiting_kv = self.kv is not None and bool(self.kv.awaiting)
        return self.pending_sync is not None or waiting_kv or self.engine.has_unfinished_requests()

    def _admit_fetched(self, now: float) -> None:
        assert self.kv is not None
        ready, records = self.kv.finished_fetches(now)
        for request in ready:
            self._admit(request)
        for record in records:
            self.publish(record, request_id=record.request_id)
            if record.error and self.log is not None:
                self.log.warning("kv transfer fell back to re-prefill", request_id=record.request_id,
                                 source=record.source, error=record.error)  # fmt: skip
        self.kv.expire_pins(now)

    def _flush_streams(self, min_tokens: int) -> None:
        """One ``TokenBatch`` for every request holding at least ``min_tokens`` unsent tokens."""
        ready = [(rid, stream) for rid, stream in self.streams.items() if len(stream.token_ids) >= min_tokens]
        if not ready:
            return
        counts = np.fromiter((len(stream.token_ids) for _, stream in ready), np.int32, len(ready))
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for _, stream in ready:
            token_ids += stream.token_ids
            logprobs += stream.logprobs
            versions += stream.versions
            stream.token_ids, stream.logprobs, stream.versions = [], [], []
        batch = TokenBatch(
            request_ids=np.fromiter((int(rid) for rid, _ in ready), np.int64, len(ready)),
            counts=counts,
            token_ids=np.asarray(token_ids, np.int32),
            logprobs=np.asarray(logprobs, np.float32),
            versions=np.asarray(versions, np.int32),
            instance=self.name,
        )
        self.send(ROUTER, batch)

    def _loop_back_preempted(self) -> None:
        threshold = self.routing.max_num_waiting_reqs_after_preemption
        waiting = self.engine.waiting_queue()
        preempted = [int(rid) for rid in waiting.preempted_request_ids if rid not in self.evals]
        if preempted:
            for rid in preempted_to_loop_back(preempted, waiting.num_waiting, threshold):
                self._hand_back(str(rid), "preempted")

    def _send_result(self, result: RequestResult, reason: str) -> None:
        stream = self.streams.pop(result.request_id, None)
        prompt_id = -1 if stream is None else stream.prompt_id
        rid = int(result.request_id)
        message = GenerateResult(
            request_id=rid,
            prompt_id=prompt_id,
            token_ids=np.asarray(result.output_ids, np.int32),
            logprobs=np.asarray(result.logprobs, np.float32),
            versions=np.asarray(result.versions, np.int32),
            finish_reason=result.finish_reason,
            instance=self.name,
            error=reason,
        )
        self.send(ROUTER, message, request_id=rid, prompt_id=prompt_id, model_version=self.engine.weight_version)

    def _send_error(self, req: GenerateRequest, reason: str) -> None:
        no_ids, no_logprobs = np.zeros(0, np.int32), np.zeros(0, np.float32)
        message = GenerateResult(
            request_id=req.request_id,
            prompt_id=req.prompt_id,
            token_ids=no_ids,
            logprobs=no_logprobs,
            versions=no_ids,
            finish_reason=FinishReason.ERROR,
            instance=self.name,
            error=reason,
        )
        self.send(ROUTER, message, request_id=req.request_id, prompt_id=req.prompt_id)

    # ------------------------------------------------------------------ status

    def status(self, now: float) -> list[Effect]:
        self._report_status()
        return self.take()

    def _report_status(self) -> None:
        s = self.engine.status()
        self.report_seq += 1
        requests = s.request_tokens.values()
        budget = self.routing.request_budget
        status = InstanceStatus(
            instance=self.name,
            weight_version=s.weight_version,
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_used=s.num_kv_blocks_used,
            kv_blocks_total=s.num_kv_blocks_total,
            tokens_per_s=s.tokens_per_s,
            prefix_hit_rate=s.prefix_hit_rate,
            num_tokens_running=s.num_kv_tokens,
            is_paused=s.is_paused or self.pending_sync is not None,
            kv_capacity_tokens=s.kv_capacity_tokens,
            budget_kv_tokens=sum(budget_request_tokens(p, o, budget) for p, o in requests),
            num_response_tokens=sum(out for _, out in requests),
            last_dispatch_seq=self.last_dispatch_seq,
            num_preempted_waiting=s.num_preempted_waiting,
            report_seq=self.report_seq,
        )
        self.send(ROUTER, status, model_version=s.weight_version)  # its link publishes it for the coordinator
        report = None if self.kv is None else self.kv.report()
        if report is not None:
            self.send(ROUTER, report, model_version=s.weight_version)
