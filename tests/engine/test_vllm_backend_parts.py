"""The vLLM backend's own logic, without vLLM: argument mapping, sampling translation, update checks, stats.

vLLM's data objects (its per-token Logprob entries, its SchedulerStats / IterationStats) are
stood in for by plain namespaces with the same fields; everything else is the real code.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from psrl.config import load_config
from psrl.engine import SamplingParams
from psrl.engine.request_checks import PriorOutputs
from psrl.engine.sequence import FinishReason
from psrl.engine.vllm_backend.args import OWNED, VllmEngineArgs
from psrl.engine.vllm_backend.requests import TrackedRequest, vllm_sampling_kwargs
from psrl.engine.vllm_backend.stats import THROUGHPUT_WINDOW_S, VllmStatistics
from psrl.engine.vllm_backend.weights import checked_update, checkpoint_shapes
from psrl.models import WeightLoadError


def test_typed_fields_map_onto_vllm_arguments_and_vllm_args_pass_through() -> None:
    config = load_config("demo", ["engine.backend=vllm", "engine.block_size=32", "engine.num_kv_blocks=40",
                                  "engine.vllm_args.max_logprobs=5", "topology.threads_per_actor=1"])  # fmt: skip
    args = VllmEngineArgs.from_config(config)
    kwargs = args.engine_kwargs()
    assert set(OWNED) <= set(kwargs) and kwargs["max_logprobs"] == 5
    assert kwargs["num_gpu_blocks_override"] == 41  # 40 usable blocks and vLLM's null block
    assert kwargs["max_model_len"] == 512  # the demo model's limit: below the 40 * 32 tokens of KV
    assert kwargs["dtype"] == "float32" and kwargs["enforce_eager"] is True and args.num_threads == 1
    assert kwargs["logprobs_mode"] == "processed_logprobs" and kwargs["skip_tokenizer_init"] is True
    smaller = VllmEngineArgs(block_size=32, num_kv_blocks=8, max_model_len=1000)
    assert smaller.context_limit() == 8 * 32
    with pytest.raises(ValueError, match=r"engine\.max_num_seqs"):
        VllmEngineArgs(extra={"max_num_seqs": 3}).engine_kwargs()


def test_sampling_counts_prior_outputs_and_stops_on_eos_unless_ignored() -> None:
    params = SamplingParams(max_tokens=10, min_tokens=4, stop_token_ids=(7,), temperature=0.5, top_k=-1)
    kwargs = vllm_sampling_kwargs(params, num_prior=3, eos_token_ids=(2,))
    assert (kwargs["max_tokens"], kwargs["min_tokens"], kwargs["top_k"]) == (7, 1, 0)
    assert kwargs["stop_token_ids"] == [2, 7] and kwargs["ignore_eos"] is True and kwargs["logprobs"] == 0
    ignoring = SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(7,), num_logprobs=3)
    kwargs = vllm_sampling_kwargs(ignoring, num_prior=0, eos_token_ids=(2,))
    assert kwargs["stop_token_ids"] == [7] and kwargs["logprobs"] == 3


def entry(logprob: float, rank: int) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, rank=rank)


def test_a_tracked_request_keeps_prior_outputs_and_picks_the_top_k() -> None:
    prior = PriorOutputs([5, 6], [-0.1, -0.2], [0, 0])
    state = TrackedRequest("r", "r-abc", [1, 2], num_logprobs=2, prior=prior)
    # the sampled token 9 is outside the top 2 (rank 3): vLLM adds it, the top-k leaves it out
    top = state.extend([9], [{9: entry(-3.0, 3), 4: entry(-0.5, 1), 8: entry(-1.5, 2)}], version=1)
    assert top == [[(4, -0.5), (8, -1.5)]]
    state.extend([4], [{4: entry(-0.4, 1), 8: entry(-1.2, 2)}], version=2)
    result = state.result(FinishReason.ABORT)
    assert result.output_ids == [5, 6, 9, 4] and result.logprobs == [-0.1, -0.2, -3.0, -0.4]
    assert result.versions == [0, 0, 1, 2] and result.num_prior_outputs == 2 and result.prompt_ids == [1, 2]
    assert result.top_logprobs == [[(4, -0.5), (8, -1.5)], [(4, -0.4), (8, -1.2)]]


def test_an_update_must_carry_the_whole_checkpoint_and_a_tied_head_follows_the_embedding(tmp_path: Path) -> None:
    tensors = {"model.embed_tokens.weight": torch.zeros(4, 2), "model.norm.weight": torch.ones(2)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    shapes = checkpoint_shapes(tmp_path)
    assert shapes == {"model.embed_tokens.weight": (4, 2), "model.norm.weight": (2,)}
    new_embedding = torch.full((4, 2), 3.0)
    loaded = dict(checked_update([("model.embed_tokens.weight", new_embedding), ("model.norm.weight", torch.ones(2)),
                                  ("lm_head.weight", torch.zeros(4, 2))], shapes))  # fmt: skip
    assert loaded["lm_head.weight"] is new_embedding and len(loaded) == 3
    with pytest.raises(WeightLoadError, match=r"missing model\.norm\.weight"):
        checked_update([("model.embed_tokens.weight", new_embedding)], shapes)
    with pytest.raises(WeightLoadError, match="shape"):
        checked_update([("model.embed_tokens.weight", torch.zeros(3, 2)), ("model.norm.weight", torch.ones(2))], shapes)
    with pytest.raises(WeightLoadError, match="not a tensor of this checkpoint"):
        checked_update([*tensors.items(), ("model.extra", torch.ones(1))], shapes)


def scheduler_stats(queries: int, hits: int, reset: bool = False) -> SimpleNamespace:
    prefix = SimpleNamespace(reset=reset, queries=queries, hits=hits, preempted_queries=0, preempted_hits=0)
    return SimpleNamespace(num_running_reqs=2, num_waiting_reqs=1, num_skipped_waiting_reqs=1, kv_cache_usage=0.25,
                           prefix_cache_stats=prefix)  # fmt: skip


def iteration_stats(generated: int, prompt: int = 0, preempted: int = 0) -> SimpleNamespace:
    return SimpleNamespace(num_generation_tokens=generated, num_prompt_tokens=prompt, num_preempted_reqs=preempted)


def test_statistics_follow_what_vllm_reports_each_step() -> None:
    stats = VllmStatistics()
    assert stats(vllm_config=None) is stats  # vLLM builds its per-engine loggers from factories
    stats.record(scheduler_stats(queries=64, hits=32), iteration_stats(generated=4, prompt=64))
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (2, 2, 0.25)
    assert stats.prefix_hit_rate == 0.5 and stats.take_step_tokens() == 68 and stats.take_step_tokens() == 0
    stats.record(scheduler_stats(queries=32, hits=0, reset=True), iteration_stats(generated=4, preempted=1))
    assert (stats.num_prefix_queried_tokens, stats.num_prefix_hit_tokens) == (32, 0)
    assert stats.num_preemptions_total == 1 and stats.num_generated_tokens_total == 8 and stats.tokens_per_s > 0


def test_an_idle_engine_reports_no_throughput_once_the_window_has_passed() -> None:
    now = [100.0]
    stats = VllmStatistics(clock=lambda: now[0])
    for _ in range(3):
        stats.record(scheduler_stats(queries=0, hits=0), iteration_stats(generated=8))
        now[0] += 0.5
    assert stats.tokens_per_s == 16 / 1.0  # the two later steps' tokens over the 1 s between the first and last
    now[0] += THROUGHPUT_WINDOW_S + 0.1  # no step since: the engine went idle
    assert stats.tokens_per_s == 0.0
