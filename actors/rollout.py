"""A rollout instance: one engine (`engine.backend`: embedded or vLLM) serving the router over a link.

Requests arrive from the router (`gen.request`); generated tokens stream back in `gen.chunk`
batches and each request ends with one `gen.result`. Control comes from the coordinator:
`coord.sync` (pause, abort or drain, pull the version from the PS, load it, resume) and
`coord.migrate` (abort the named requests so the router places them elsewhere). An interrupted
request's result says why (``error`` = sync / migrate / preempted / requested) so the router
knows whether to continue it elsewhere. Status snapshots go to the router on the link and to
everyone on the bus.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from actors.base import Actor, handles
from actors.links import Link
from bus.messages import (
    Abort,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InstanceStatus,
    InstanceSyncFailed,
    MigrateCommand,
    PullRequest,
    SyncCommand,
    TokenChunk,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Event
from psrl.engine import build_engine
from psrl.engine.outputs import RequestResult
from psrl.engine.sequence import FinishReason as EngineFinish
from psrl.errors import RequestError
from psrl.ps import PullFailedError
from psrl.ps.from_config import make_puller
from psrl.ps.prefetch import Prefetcher
from psrl.routing.budget import budget_request_tokens
from psrl.routing.preemption import preempted_to_loop_back

STREAM_EVERY_TOKENS = 16  # chunk size of token streaming (a dead instance loses at most this much)
_FINISH = {EngineFinish.STOP: FinishReason.STOP, EngineFinish.LENGTH: FinishReason.LENGTH,
           EngineFinish.ABORT: FinishReason.ABORT}  # fmt: skip


@dataclass
class _Stream:
    """Tokens of one request not yet sent to the router."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Loaded:
    version: int
    prefetched: bool  # the bytes came from a background pull
    pull_ms: float  # getting the bytes into host memory (pulling, or waiting for the background pull)


@dataclass
class _PendingSync:
    version: int
    abort_running: bool
    since: float


class RolloutActor(Actor):
    ROLE = "rollout"

    def setup(self) -> dict[str, int]:
        self.engine = build_engine(self.config)
        # vLLM's exit-time finalizers take 10-30 s on 2 busy cores; teardown below releases what matters
        self.exit_without_interpreter_teardown = self.config.engine.backend == "vllm"
        self.link = Link(self.ctx, self.boot.endpoint("router"), sender=self.name, incarnation=self.boot.incarnation,
                         settings=self.bus, serve=False, identity=self.name)  # fmt: skip
        self.add_input(self.link.socket, self._on_link)
        shards = range(self.config.topology.n_ps_shards)
        self.puller = make_puller(self.config, [self.boot.endpoint(f"ps-{i}.1") for i in shards])
        ps = self.config.psrl.ps
        self.prefetcher = Prefetcher(self.puller, ps.pull_attempts) if ps.prefetch and not ps.delta_sync else None
        self.streams: dict[str, _Stream] = {}
        self.prompt_ids: dict[str, int] = {}
        self.pending_sync: _PendingSync | None = None
        self.last_dispatch_seq = -1
        self.report_seq = 0
        self.routing = self.config.psrl.rollout_coordination.routing_strategy
        collection = self.config.psrl.status_collection
        if collection.enable:
            self.every(collection.engine_sync_interval_in_ms / 1000, self._report_status)
        self._report_status()  # always once: it is how the router learns the instance exists
        status = self.engine.status()
        return {"kv_blocks": status.num_kv_blocks_total, "max_num_seqs": self.config.engine.max_num_seqs}

    @property
    def num_inflight(self) -> int:
        return len(self.streams)

    # ------------------------------------------------------------------ requests

    def _on_link(self) -> None:
        received = self.link.recv()
        if received is None:
            return
        for event in received[1]:
            self.dispatch(event)

    @handles(GenerateRequest, link=True)
    def _on_generate(self, event: Event[GenerateRequest]) -> None:
        req = event.message
        rid = str(req.request_id)
        sp = req.sampling
        sampling = {"max_tokens": sp.max_tokens, "temperature": sp.temperature, "top_p": sp.top_p,
                    "top_k": sp.top_k, "stop_token_ids": list(sp.stop_token_ids), "seed": sp.seed,
                    "min_tokens": sp.min_tokens, "ignore_eos": sp.ignore_eos}  # fmt: skip
        try:
            self.engine.add_request(
                rid,
                req.prompt_token_ids.tolist(),
                sampling,
                prior_output_ids=None if req.generated_token_ids is None else req.generated_token_ids.tolist(),
                prior_logprobs=None if req.generated_logprobs is None else req.generated_logprobs.tolist(),
                prior_versions=None if req.generated_versions is None else req.generated_versions.tolist(),
            )
        except RequestError as exc:
            self._send_error(req, str(exc.reason))
            return
        self.streams[rid] = _Stream()
        self.prompt_ids[rid] = req.prompt_id
        self.last_dispatch_seq = max(self.last_dispatch_seq, req.dispatch_seq)

    @handles(Abort, link=True)
    def _on_abort(self, event: Event[Abort]) -> None:
        self._abort([str(r) for r in event.message.request_ids], event.message.reason or "requested")

    @handles(MigrateCommand)
    def _on_migrate(self, event: Event[MigrateCommand]) -> None:
        cmd = event.message
        if cmd.source == self.name:
            ids = [str(r) for r in cmd.request_ids] if cmd.request_ids else list(self.streams)
            if not cmd.request_ids and cmd.num_requests > 0:
                ids = ids[-cmd.num_requests :]  # the newest requests carry the least progress
            self._abort(ids, "migrate")

    def _abort(self, request_ids: list[str], reason: str) -> None:
        for rid in request_ids:
            result = self.engine.abort(rid)
            if result is not None:
                self._send_result(result, reason)

    # ------------------------------------------------------------------ weights

    @handles(SyncCommand)
    def _on_sync(self, event: Event[SyncCommand]) -> None:
        cmd = event.message
        if self.name not in cmd.instances or cmd.version <= self.engine.weight_version:
            return
        self.pending_sync = _PendingSync(cmd.version, cmd.abort_running, time.monotonic())
        if cmd.abort_running and not self._version_arriving(cmd.version):
            self._abort(list(self.streams), "sync")

    @handles(WeightsPublished)
    def _on_published(self, event: Event[WeightsPublished]) -> None:
        if self.prefetcher is not None and event.message.version > self.engine.weight_version:
            self.prefetcher.start(event.message.version)

    def _version_arriving(self, version: int) -> bool:
        """The background pull of `version` is still running: interrupting now would only make requests wait."""
        return self.prefetcher is not None and self.prefetcher.is_pulling(version)

    def _sync_if_due(self) -> bool:
        """Pull and load the pending version once no request holds the old weights.

        Under partial rollout the requests are interrupted here, once the version's bytes have arrived.
        """
        sync = self.pending_sync
        if sync is None:
            return False
        if sync.abort_running and self.streams:
            if self._version_arriving(sync.version):
                return False
            self._abort(list(self.streams), "sync")
        if self.engine.has_unfinished_requests():
            return False
        self.pending_sync = None
        self.engine.pause()
        self.publisher.publish(PullRequest(self.name, sync.version), model_version=sync.version)
        started = time.monotonic()
        try:
            loaded = self._pull(sync.version)
        except (PullFailedError, ValueError, RuntimeError) as exc:
            self.log.error("sync failed", version=sync.version, error=str(exc))
            self.publisher.publish(InstanceSyncFailed(self.name, sync.version, str(exc)))
            self.engine.resume()
            return True
        self.engine.resume()
        load_ms = (time.monotonic() - started) * 1000
        self.publisher.publish(WeightsLoaded(self.name, loaded.version, load_ms, loaded.prefetched, loaded.pull_ms),
                               model_version=loaded.version)  # fmt: skip
        self._report_status()
        return True

    def _pull(self, version: int) -> _Loaded:
        """Pull every tensor first and load them in one step: a failed pull leaves the old weights intact."""
        started = time.monotonic()
        tensors = self.prefetcher.take(version) if self.prefetcher is not None else None
        was_prefetched = tensors is not None
        if tensors is None:
            pulled: dict[str, torch.Tensor] = {}  # by name: a retried pull replaces what it loaded
            version = self.puller.sync(pulled.__setitem__, version, self.config.psrl.ps.pull_attempts).version
            tensors = list(pulled.items())
        pull_ms = (time.monotonic() - started) * 1000
        self.engine.load_weights(tensors, version)
        return _Loaded(version, was_prefetched, pull_ms)

    # ------------------------------------------------------------------ stepping

    def step(self) -> bool:
        if self._sync_if_due():
            return True
        if not self.engine.has_unfinished_requests():
            return False
        out = self.engine.step()
        for delta in out.outputs:
            stream = self.streams.get(delta.request_id)
            if stream is not None:
                stream.token_ids += delta.token_ids
                stream.logprobs += delta.logprobs
                stream.versions += delta.versions
        for result in out.finished:
            self._send_result(result, "")
        self._flush_streams(STREAM_EVERY_TOKENS)
        self._loop_back_preempted()
        return self.engine.has_unfinished_requests()

    def _flush_streams(self, min_tokens: int) -> None:
        chunks = []
        for rid, stream in self.streams.items():
            if len(stream.token_ids) >= min_tokens:
                chunks.append(TokenChunk(int(rid), np.asarray(stream.token_ids, np.int32),
                                         np.asarray(stream.logprobs, np.float32),
                                         np.asarray(stream.versions, np.int32), self.name))  # fmt: skip
                stream.token_ids, stream.logprobs, stream.versions = [], [], []
        if chunks:
            self.link.send_many(chunks)

    def _loop_back_preempted(self) -> None:
        threshold = self.routing.max_num_waiting_reqs_after_preemption
        waiting = self.engine.waiting_queue()
        preempted = [int(rid) for rid in waiting.preempted_request_ids]
        if preempted:
            for rid in preempted_to_loop_back(preempted, waiting.num_waiting, threshold):
                result = self.engine.abort(str(rid))
                if result is not None:
                    self._send_result(result, "preempted")

    def _send_result(self, result: RequestResult, reason: str) -> None:
        rid = result.request_id
        self.streams.pop(rid, None)
        prompt_id = self.prompt_ids.pop(rid, -1)
        self.link.send(
            GenerateResult(int(rid), prompt_id, np.asarray(result.output_ids, np.int32),
                           np.asarray(result.logprobs, np.float32), np.asarray(result.versions, np.int32),
                           _FINISH[result.finish_reason], self.name, reason),
            request_id=int(rid), prompt_id=prompt_id, model_version=self.engine.weight_version,
        )  # fmt: skip

    def _send_error(self, req: GenerateRequest, reason: str) -> None:
        empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
        self.link.send(
            GenerateResult(req.request_id, req.prompt_id, empty_i, empty_f, empty_i, FinishReason.ERROR, self.name,
                           reason),
            request_id=req.request_id, prompt_id=req.prompt_id,
        )  # fmt: skip

    # ------------------------------------------------------------------ status

    def _report_status(self) -> None:
        s = self.engine.status()
        self.report_seq += 1
        response_tokens = sum(out for _, out in s.request_tokens.values())
        budget = sum(budget_request_tokens(p, o, self.routing.request_budget) for p, o in s.request_tokens.values())
        status = InstanceStatus(
            self.name, s.weight_version, s.num_running, s.num_waiting, s.num_kv_blocks_used, s.num_kv_blocks_total,
            s.tokens_per_s, s.prefix_hit_rate, s.num_kv_tokens, s.is_paused or self.pending_sync is not None,
            s.kv_capacity_tokens, budget, response_tokens, self.last_dispatch_seq, s.num_preempted_waiting,
            self.report_seq,
        )  # fmt: skip
        self.link.send(status)
        self.publisher.publish(status, model_version=s.weight_version)

    def on_pause(self) -> None:
        self.engine.pause()

    def on_resume(self) -> None:
        self.engine.resume()

    def teardown(self) -> None:
        if hasattr(self, "engine"):
            self._abort(list(self.streams), "shutdown")
            self.link.close()
            # a pull still running in the background owns the puller's sockets: leave them to the exit
            if self.prefetcher is None or self.prefetcher.close():
                self.puller.close()
