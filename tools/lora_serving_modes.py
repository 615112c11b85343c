"""The embedded engine's two ways of serving LoRA versions, measured side by side in one run
(``tools/bench_lora_sync.py --modes``): merge (adapters merged into the base weights on load) and
unmerged (base weights kept, ``(x @ A^T) @ B^T`` added in each targeted projection).

For each mode, one engine over the same checkpoint on ``device``: the load of an adapter version
(``Engine.load_weights`` from host tensors, to the engine holding it; median over the versions after
the first) and the decode step (a batch of greedy requests run to ``max_tokens`` after their prefill
step; wall time over the tokens each sequence generated, so decode rounds of several tokens count per
token). Both engines serve the same versions; their greedy tokens are compared too, as a check that
the figures are of the same computation.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.engine.lora_merge import LoraServing
from psrl.models import iter_safetensors
from psrl.models.lora import adapter_names

MODES = ("merge", "unmerged")
PROMPT_LEN = 16


@dataclass
class ModeRun:
    """One mode's engine and what it measured."""

    engine: Engine
    load_s: list[float] = field(default_factory=list)
    step_s_per_token: list[float] = field(default_factory=list)  # each decode step over the tokens a sequence got
    tokens: dict[str, list[int]] = field(default_factory=dict)


def adapter_version(base: dict[str, torch.Tensor], targets: tuple[str, ...], rank: int, seed: int
                    ) -> dict[str, torch.Tensor]:  # fmt: skip
    """An adapter version for every targeted projection of ``base`` (values of a trained one's size)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rpartition(".")[2] in targets:
            lora_a, lora_b = adapter_names(module)
            out[lora_a] = torch.randn(rank, weight.shape[1], generator=gen) * 0.05
            out[lora_b] = torch.randn(weight.shape[0], rank, generator=gen) * 0.01
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_engine(model_dir: Path, mode: str, lora: LoraServing, device: torch.device, batch: int, max_tokens: int
                 ) -> Engine:  # fmt: skip
    serving = LoraServing(lora.alpha, lora.target_modules, lora.rank, mode)  # type: ignore[arg-type]
    block_size = EngineArgs().block_size
    blocks = batch * ((PROMPT_LEN + max_tokens) // block_size + 2)  # the whole batch resident: no preemption
    return Engine(EngineArgs(model_path=model_dir, device=device.type, num_kv_blocks=blocks, max_num_seqs=batch,
                             lora=serving))  # fmt: skip


def time_load(run: ModeRun, named: list[tuple[str, torch.Tensor]], version: int, device: torch.device) -> None:
    _sync(device)
    started = time.perf_counter()
    run.engine.load_weights(named, version)
    _sync(device)
    run.load_s.append(time.perf_counter() - started)


def time_decode(run: ModeRun, batch: int, max_tokens: int, device: torch.device) -> None:
    """A batch of greedy requests: the prefill step untimed, then every decode step timed."""
    engine = run.engine
    vocab = engine.spec.vocab_size
    for index in range(batch):
        prompt = [(7 * index + 3 * j) % (vocab - 2) + 2 for j in range(PROMPT_LEN)]
        engine.add_request(str(index), prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    run.tokens = {str(i): [] for i in range(batch)}
    step_outputs = [engine.step()]  # the prefill (and the first token)
    while engine.has_unfinished_requests():
        _sync(device)
        started = time.perf_counter()
        out = engine.step()
        _sync(device)
        elapsed = time.perf_counter() - started
        step_outputs.append(out)
        per_sequence = sum(len(o.token_ids) for o in out.outputs) / batch
        if per_sequence > 0:
            run.step_s_per_token.append(elapsed / per_sequence)
    for out in step_outputs:
        for o in out.outputs:
            run.tokens[o.request_id] += o.token_ids


def compare_modes(model_dir: Path, rank: int, targets: tuple[str, ...], device: torch.device, num_versions: int,
                  batch: int, max_tokens: int, rounds: int = 3) -> dict[str, float]:  # fmt: skip
    """Both modes on ``model_dir``, measured alternately (a busy machine slows both alike); the RESULT figures
    (medians in ms, and unmerged over merge)."""
    base = dict(iter_safetensors(model_dir))
    versions = [adapter_version(base, targets, rank, seed) for seed in range(1, num_versions + 1)]
    del base
    lora = LoraServing(2.0 * rank, targets, rank)
    runs = {mode: ModeRun(build_engine(model_dir, mode, lora, device, batch, max_tokens)) for mode in MODES}
    for number, version in enumerate(versions, start=1):
        for run in runs.values():
            time_load(run, list(version.items()), number, device)
    for _ in range(rounds):
        for run in runs.values():
            time_decode(run, batch, max_tokens, device)
    merge, unmerged = runs["merge"], runs["unmerged"]
    load = {mode: statistics.median(run.load_s[1:] or run.load_s) * 1000 for mode, run in runs.items()}  # 1st warms
    step = {mode: statistics.median(run.step_s_per_token) * 1000 for mode, run in runs.items()}
    same = sum(merge.tokens[rid] == unmerged.tokens[rid] for rid in merge.tokens)
    # where a near-flat (random-weight) model lets the two roundings pick different tokens, how far they agree first
    prefix = statistics.mean(_common_share(merge.tokens[rid], unmerged.tokens[rid]) for rid in merge.tokens)
    for mode in MODES:
        print(f"lora_mode={mode}: load of a version {load[mode]:.2f} ms, decode step {step[mode]:.3f} ms "
              f"(median; batch {batch}, {max_tokens} tokens x {rounds} rounds, {device})")  # fmt: skip
    print(f"unmerged / merge: load {load['unmerged'] / load['merge']:.3f}x, decode step "
          f"{step['unmerged'] / step['merge']:.3f}x; greedy sequences equal: {same}/{batch}, "
          f"the same up to the first difference: {prefix:.2f} of each on average")  # fmt: skip
    return {
        "merge_load_ms": load["merge"],
        "unmerged_load_ms": load["unmerged"],
        "merge_step_ms": step["merge"],
        "unmerged_step_ms": step["unmerged"],
        "unmerged_vs_merge_load": load["unmerged"] / load["merge"],
        "unmerged_vs_merge_step": step["unmerged"] / step["merge"],
        "modes_same_greedy": same / batch,
        "modes_common_prefix": prefix,
    }


def _common_share(a: list[int], b: list[int]) -> float:
    """The share of the longer sequence that both hold before their first different token."""
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / longest
