"""The embedded rollout engine: add requests, step, stream tokens, abort, swap weights.

Single-threaded by design: the rollout actor calls every method from one thread, between steps.
Each step is schedule -> run the model -> sample -> post-process. Every sampled token is stamped
with the weight version that produced it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as SequenceLike
from typing import Any

import structlog
import torch

from bus.messages import FinishReason
from psrl.engine.args import EngineArgs
from psrl.engine.block_manager import BlockManager
from psrl.engine.decode_rounds import DecodeRounds
from psrl.engine.kv_offload import EngineOffload, make_tier
from psrl.engine.lora_unmerged import lora_applier
from psrl.engine.model_runner import ModelRunner, RunnerShape
from psrl.engine.outputs import EngineStatus, RequestOutput, RequestResult, StepOutput, WaitingQueue
from psrl.engine.request_checks import check_prior_outputs, check_room, check_token_ids, coerce_sampling_params
from psrl.engine.sampler import Sampler
from psrl.engine.sampling_params import SamplingParams
from psrl.engine.scheduler import ScheduledBatch, Scheduler
from psrl.engine.sequence import Sequence, SequenceStatus
from psrl.errors import RequestError
from psrl.kernels.cpu_sample import CpuSampleKernel
from psrl.kernels.library import resolve_cpu_kernels
from psrl.kvcache.index import TierKey
from psrl.kvcache.keys import prefix_hashes, reusable_blocks
from psrl.kvcache.tier import KvTier
from psrl.models import ModelSpec, build_model, iter_safetensors
from psrl.models.lora import AdapterError, is_adapter_name
from psrl.models.step_kernels import resolve_step_kernels
from psrl.tms import ROLLOUT, SideMemory, SwitchReport

log = structlog.get_logger(__name__)

WeightSource = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
THROUGHPUT_WINDOW_S = 5.0
SEED_MASK = (1 << 64) - 1


class Engine:
    def __init__(
        self, args: EngineArgs, weights: WeightSource | None = None, *, memory: SideMemory | None = None
    ) -> None:
        """Load the checkpoint at `args.model_path` (or `weights` with that directory's config.json).

        `memory` (``psrl.tms``): weights, KV cache and captured graphs go to its regions, which
        ``release_memory`` and ``restore_memory`` switch; by default everything stays resident.
        """
        self.args = args
        self.memory = memory or SideMemory.unmanaged(ROLLOUT)
        self.spec = ModelSpec.from_dir(args.model_path)
        self.device = args.resolve_device()
        self.dtype = args.resolve_dtype(self.device)
        self.max_model_len = _max_model_len(args, self.spec)
        # an iterable is consumed as it goes: a checkpoint never sits in memory twice
        source = iter_safetensors(args.model_path) if weights is None else _weight_items(weights)
        # under LoRA (merge mode) the base weights of the targeted projections are kept as they stream in
        self.lora = None if args.lora is None else lora_applier(args.lora, self.device, self.dtype)
        if self.lora is not None:
            source = self.lora.capture(source)
        with self.memory.region("weights"):
            model = build_model(self.spec, self.max_model_len, self.dtype, self.device, source)
            if self.lora is not None:  # kept base weights / unmerged adapters: in the weights' region (psrl.tms)
                self.lora.check_targets()
                self.lora.attach(model)
        shape = RunnerShape(args.num_kv_blocks, args.block_size, args.max_num_seqs, self.max_model_len)
        if args.cpu_kernels == "on" and self.dtype != torch.float32:
            raise ValueError(f"engine.cpu_kernels=on needs dtype float32, not {self.dtype}")
        if args.decode_steps < 1:
            raise ValueError(f"engine.decode_steps must be at least 1, not {args.decode_steps}")
        cpu_library = resolve_cpu_kernels(args.cpu_kernels, self.device.type)
        step_kernels = resolve_step_kernels(
            args.gpu_kernels, self.device, self.spec.head_dim, has_qk_norm=self.spec.has_qk_norm
        )
        self.runner = ModelRunner(
            model,
            shape,
            self.dtype,
            cuda_graphs=args.cuda_graphs,
            bucketed_decode=args.bucketed_decode,
            dense_decode=args.dense_decode,
            cpu_library=cpu_library,
            step_kernels=step_kernels,
            decode_steps=args.decode_steps,
            memory=self.memory,
        )
        self.offload = self._make_offload(args)
        self.block_manager = BlockManager(
            args.num_kv_blocks, args.block_size, args.enable_prefix_caching, tier=self.offload
        )
        self.scheduler = Scheduler(
            self.block_manager, args.max_num_seqs, args.max_num_batched_tokens, self.max_model_len
        )
        sample_kernel = None if cpu_library is None else CpuSampleKernel(cpu_library)
        self.sampler = Sampler(self.device, self.spec.eos_token_ids, args.seed, sample_kernel, step_kernels)
        self.weight_version = args.initial_weight_version
        self.is_paused = False
        self._seqs: dict[str, Sequence] = {}
        self._num_arrivals = 0
        self._num_generated_total = 0
        self._recent_steps: deque[tuple[float, int]] = deque()
        rounds = self.runner.rounds
        self._captures_when_idle = args.capture_graphs_when_idle and rounds is not None and rounds.use_graphs
        self._idle_capture_s = 0.0
        if args.capture_graphs_at_start and self.runner.rounds is not None:
            self._capture_rounds(self.runner.rounds)
        log.info("engine_ready", model=str(args.model_path), device=str(self.device), dtype=str(self.dtype),
                 max_model_len=self.max_model_len, kv_blocks=args.num_kv_blocks, decode=self.runner.decode_path,
                 decode_steps=args.decode_steps if self.runner.rounds is not None else 1)  # fmt: skip

    @staticmethod
    def _capture_rounds(rounds: DecodeRounds) -> None:
        started = time.perf_counter()
        with torch.inference_mode():
            count = rounds.capture_all()
        log.info("decode_graphs_captured", graphs=count, seconds=round(time.perf_counter() - started, 2))

    def _make_offload(self, args: EngineArgs) -> EngineOffload | None:
        if args.offload_bytes <= 0:
            return None
        if not args.enable_prefix_caching:
            raise ValueError("the offload tier (psrl.lmcache.enable) needs engine.enable_prefix_caching=True")
        shape = tuple(self.runner.kv_cache[:, 0].shape)
        tier = make_tier(
            args.offload_bytes, shape, self.dtype, args.offload_policy, args.offload_pin_budget, args.offload_store,
            pin=self.device.type == "cuda",
        )  # fmt: skip
        return EngineOffload(tier, self.runner.kv_cache, lambda: self.weight_version)

    @property
    def kv_tier(self) -> KvTier | None:
        """The offload tier (None without psrl.lmcache)."""
        return None if self.offload is None else self.offload.tier

    def export_prefix_kv(self, token_ids: SequenceLike[int]) -> list[TierKey]:
        """Copy the device-cached whole blocks of ``token_ids``'s prefix to the tier (a peer will ask for
        them); returns their keys, in prefix order. Nothing without a tier."""
        if self.offload is None:
            return []
        return self.offload.offload_blocks(self.block_manager.cached_blocks(list(token_ids)))

    def prefix_keys(self, token_ids: SequenceLike[int]) -> list[TierKey]:
        """Tier keys, under the current weights, of the whole blocks a request of ``token_ids`` could reuse."""
        size = self.args.block_size
        hashes = prefix_hashes(token_ids, size, reusable_blocks(len(token_ids), size))
        return [(self.weight_version, block_hash) for block_hash in hashes]

    # requests

    def add_request(
        self,
        request_id: str,
        prompt_ids: SequenceLike[int],
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        *,
        prior_output_ids: SequenceLike[int] | None = None,
        prior_logprobs: SequenceLike[float] | None = None,
        prior_versions: SequenceLike[int] | None = None,
    ) -> None:
        """Queue a request; `prior_*` continue it from tokens an earlier run already generated.

        max_tokens counts prior outputs too, so a continued request ends where an uninterrupted
        one would. Raises RequestError (and changes nothing) when the request is invalid.
        """
        params = coerce_sampling_params(request_id, sampling)
        if request_id in self._seqs:
            raise RequestError(request_id, "a request with this id is already in the engine")
        prompt = check_token_ids(request_id, "prompt_ids", prompt_ids, self.spec.vocab_size, allow_empty=False)
        prior = check_prior_outputs(request_id, prior_output_ids, prior_logprobs, prior_versions, self.spec.vocab_size)
        check_room(request_id, len(prompt), prior, params.max_tokens, self.max_model_len)
        generator = None if params.seed is None else self.sampler.make_generator(params.seed)
        seed = hash((self.args.seed, self._num_arrivals)) if params.seed is None else params.seed
        seq = Sequence(
            request_id,
            prompt,
            params,
            self._num_arrivals,
            prior_output_ids=prior.token_ids,
            prior_logprobs=prior.logprobs,
            prior_versions=prior.versions,
            generator=generator,
            sampling_seed=seed & SEED_MASK,
        )
        self._num_arrivals += 1
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def expect_kv(self, request_id: str) -> None:
        """``request_id``'s prefix KV is on its way into the tier (an async transfer): until
        ``kv_arrived``, it is prefilled in short chunks, each after taking what has landed."""
        seq = self._seqs.get(request_id)
        if seq is not None and self.offload is not None:
            seq.kv_arriving = True

    def kv_arrived(self, request_id: str) -> None:
        """The transfer ended (whatever landed is in the tier): take it now, prefill the rest plainly."""
        seq = self._seqs.get(request_id)
        if seq is None or not seq.kv_arriving:
            return
        seq.kv_arriving = False
        if seq.status == SequenceStatus.RUNNING and seq.is_prefilling:
            self.block_manager.extend_from_tier(seq)

    def abort(self, request_id: str) -> RequestResult | None:
        """Stop a request; returns exactly what it generated so far (None if it is not in the engine)."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.remove(seq)
        return RequestResult.from_sequence(seq, FinishReason.ABORT)

    def abort_all(self) -> list[RequestResult]:
        return [result for request_id in list(self._seqs) if (result := self.abort(request_id)) is not None]

    def has_unfinished_requests(self) -> bool:
        return bool(self._seqs)

    def capture_when_idle(self) -> bool:
        """With nothing to run, capture one decode round that has no CUDA graph yet, so no running batch
        stops for it later (engine.capture_graphs_when_idle); whether one was captured."""
        rounds = self.runner.rounds
        if not self._captures_when_idle or self._seqs or self.is_paused or self.memory.is_paused:
            return False
        assert rounds is not None
        started = time.perf_counter()
        with torch.inference_mode():
            captured = rounds.capture_next()
        self._idle_capture_s += time.perf_counter() - started
        if not captured:  # every bucket has its round: stop asking
            self._captures_when_idle = False
            log.info("decode_graphs_captured_when_idle", seconds=round(self._idle_capture_s, 2))
        return captured

    def waiting_queue(self) -> WaitingQueue:
        waiting = self.scheduler.waiting
        return WaitingQueue(len(waiting), [seq.request_id for seq in waiting if seq.num_preemptions > 0])

    # stepping

    def step(self) -> StepOutput:
        """Run one scheduling step and return the tokens it produced (nothing while paused or released)."""
        if self.is_paused or self.memory.is_paused:
            return StepOutput()
        round_steps = self._round_steps()
        batch = self.scheduler.schedule(max(round_steps, 1))
        self._flush_tier_copies()
        if batch is None:
            return StepOutput()
        if round_steps and not batch.is_prefill:
            return self._step_round(batch)
        logits, sampled_seqs = self.runner.execute(batch)
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += num_new
            self.block_manager.hash_blocks(seq)
        out = StepOutput(num_computed_tokens=batch.num_tokens)
        if sampled_seqs:
            self._postprocess(sampled_seqs, logits, out)
        self._record_throughput(len(sampled_seqs))
        return out

    def _round_steps(self) -> int:
        """Decode steps of the next round when it can run on the device (0: one step, sampled by the Sampler)."""
        running = self.scheduler.running
        if self.runner.rounds is None or not running or not self.sampler.samples_on_device(running):
            return 0
        return self.args.decode_steps

    def _step_round(self, batch: ScheduledBatch) -> StepOutput:
        """A decode round: every sequence's tokens up to its first stop token or length limit are kept."""
        result = self.runner.run_round(batch.seqs, batch.num_steps)
        out = StepOutput()
        version, blocks = self.weight_version, self.block_manager
        for seq, round_tokens, round_logprobs in zip(batch.seqs, result.token_ids, result.logprobs, strict=True):
            count, reason = self._accepted(seq, round_tokens)
            tokens, logprobs = round_tokens[:count], round_logprobs[:count]
            versions = [version] * count
            seq.token_ids += tokens
            seq.logprobs += logprobs
            seq.versions += versions
            seq.num_computed_tokens = len(seq.token_ids) - 1
            blocks.hash_blocks(seq)
            out.outputs.append(RequestOutput(seq.request_id, tokens, logprobs, versions, None, reason))
            out.num_computed_tokens += count
            if reason is not None:
                self.scheduler.remove(seq)
                del self._seqs[seq.request_id]
                out.finished.append(RequestResult.from_sequence(seq, reason))
        self._record_throughput(out.num_computed_tokens)
        return out

    def _accepted(self, seq: Sequence, tokens: list[int]) -> tuple[int, FinishReason | None]:
        """How many of a round's tokens `seq` keeps, and why it finishes (as _finish_reason decides per token)."""
        params = seq.params
        num_tokens = len(seq.token_ids)
        num_outputs = num_tokens - seq.num_prompt_tokens
        remaining = min(params.max_tokens - num_outputs, self.max_model_len - num_tokens)
        limit = min(len(tokens), remaining)
        if params.stop_token_ids or not params.ignore_eos:
            eos = () if params.ignore_eos else self.spec.eos_token_ids
            # token i brings the outputs to num_outputs + i + 1; stops count from min_tokens on
            for index in range(max(0, params.min_tokens - num_outputs - 1), limit):
                if tokens[index] in params.stop_token_ids or tokens[index] in eos:
                    return index + 1, FinishReason.STOP
        return limit, FinishReason.LENGTH if limit == remaining else None

    def _postprocess(self, seqs: list[Sequence], logits: torch.Tensor, out: StepOutput) -> None:
        sample = self.sampler.sample(logits, seqs)
        for row, seq in enumerate(seqs):
            token_id, logprob = sample.token_ids[row], sample.logprobs[row]
            seq.append_token(token_id, logprob, self.weight_version)
            top = sample.top_logprobs[row]
            if seq.top_logprobs is not None and top is not None:
                seq.top_logprobs.append(top)
            reason = self._finish_reason(seq, token_id)
            out.outputs.append(RequestOutput(seq.request_id, [token_id], [logprob], [self.weight_version],
                                             None if top is None else [top], reason))  # fmt: skip
            if reason is not None:
                self.scheduler.remove(seq)
                del self._seqs[seq.request_id]
                out.finished.append(RequestResult.from_sequence(seq, reason))

    def _finish_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.params
        if seq.num_outputs >= params.min_tokens and (
            token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.spec.eos_token_ids)
        ):
            return FinishReason.STOP
        if seq.num_outputs >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    # control

    def pause(self) -> None:
        """Stop stepping; requests keep their state and KV and can still be added or aborted."""
        self.is_paused = True

    def resume(self) -> None:
        self.is_paused = False

    def release_memory(self) -> SwitchReport:
        """Release the managed GPU memory: running sequences are preempted first (their tokens stay; they are
        prefilled again after ``restore_memory``) and the prefix cache is forgotten, since the KV cache's
        contents are not kept. Nothing runs on the GPU until ``restore_memory``."""
        self.scheduler.preempt_all()
        self.reset_prefix_cache()  # after the copies to and from the tier decided so far have run
        return self.memory.pause()

    def restore_memory(self) -> SwitchReport:
        """Re-acquire the memory ``release_memory`` released, at the same addresses (weights with their values)."""
        return self.memory.resume()

    def load_weights(self, weights: WeightSource, version: int, *, reset_prefix_cache: bool = True) -> int:
        """Replace weights in place (all or some tensors, any dtype); the next step uses them.

        Every name and shape is checked before anything is copied, so a bad update changes nothing.
        Cached prefixes are dropped by default: their keys/values came from the old weights.
        With ``EngineArgs.lora``, LoRA adapter tensors are merged onto the kept base weights first
        (``lora_merge.py``) or, unmerged, copied into the projections' adapters (``lora_unmerged.py``);
        without it they are refused (AdapterError).
        """
        if self.offload is not None and not reset_prefix_cache:
            raise ValueError("with an offload tier every weight load resets the prefix cache (version tags)")
        self._flush_tier_copies()  # blocks given up under the old weights go to the tier under its version
        named = _named_tensors(weights)
        if self.lora is not None:  # adapters become merged weights, or are staged for the unmerged projections
            named = self.lora.prepare(named)
        elif any(is_adapter_name(name) for name, _ in named):
            raise AdapterError("LoRA adapters sent to an engine built without actor.lora (EngineArgs.lora is None)")
        self._check_weights(named)
        self.runner.model.load_weights(named)
        if self.lora is not None:
            self.lora.commit()
        self.weight_version = version
        if reset_prefix_cache:
            self.reset_prefix_cache()
        if self.offload is not None and self.args.offload_clear_on_update:
            self.offload.tier.clear()
        log.info("weights_loaded", version=version, num_tensors=len(named))
        return len(named)

    def reset_prefix_cache(self) -> None:
        self._flush_tier_copies()
        self.block_manager.reset_prefix_cache()

    def _flush_tier_copies(self) -> None:
        """Run the copies between the KV cache and the tier decided since the last step (before the KV
        cache is written or released, or the tier changes otherwise)."""
        if self.offload is not None:
            self.offload.flush()

    def _check_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named:
            self.runner.model.check_weight(name, tensor)

    # status

    def status(self) -> EngineStatus:
        scheduler, blocks = self.scheduler, self.block_manager
        return EngineStatus(
            weight_version=self.weight_version,
            is_paused=self.is_paused,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            num_preempted_waiting=sum(1 for seq in scheduler.waiting if seq.num_preemptions > 0),
            num_preemptions_total=scheduler.num_preemptions,
            num_kv_blocks_used=blocks.num_used_blocks,
            num_kv_blocks_total=blocks.num_blocks,
            num_kv_tokens=sum(seq.num_computed_tokens for seq in scheduler.running),
            kv_capacity_tokens=blocks.num_blocks * blocks.block_size,
            tokens_per_s=self._tokens_per_s(),
            prefix_hit_rate=blocks.stats.hit_rate,
            num_prefix_hit_tokens=blocks.stats.num_hit_tokens,
            num_prefix_queried_tokens=blocks.stats.num_queried_tokens,
            num_generated_tokens_total=self._num_generated_total,
            max_model_len=self.max_model_len,
            request_tokens={rid: (seq.num_prompt_tokens, seq.num_outputs) for rid, seq in self._seqs.items()},
            num_tier_loaded_tokens=blocks.num_tier_loaded_blocks * blocks.block_size,
            num_tier_offloaded_blocks=0 if self.offload is None else self.offload.num_offloaded_blocks,
        )

    def _record_throughput(self, num_generated: int) -> None:
        now = time.monotonic()
        self._num_generated_total += num_generated
        self._recent_steps.append((now, num_generated))
        while self._recent_steps and now - self._recent_steps[0][0] > THROUGHPUT_WINDOW_S:
            self._recent_steps.popleft()

    def _tokens_per_s(self) -> float:
        if len(self._recent_steps) < 2:
            return 0.0
        elapsed = self._recent_steps[-1][0] - self._recent_steps[0][0]
        num_tokens = sum(count for _, count in list(self._recent_steps)[1:])
        return num_tokens / elapsed if elapsed > 0 else 0.0


def _weight_items(weights: WeightSource) -> Iterable[tuple[str, torch.Tensor]]:
    return weights.items() if isinstance(weights, Mapping) else weights


def _named_tensors(weights: WeightSource) -> list[tuple[str, torch.Tensor]]:
    return list(_weight_items(weights))


def _max_model_len(args: EngineArgs, spec: ModelSpec) -> int:
    limit = min(spec.max_position_embeddings, args.num_kv_blocks * args.block_size)
    return limit if args.max_model_len is None else min(limit, args.max_model_len)
