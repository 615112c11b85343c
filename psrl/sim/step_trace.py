"""Engine steps as the cost model sees them: recorded in a run, turned into samples for its fit.

A run that records every engine step (``tools/agentic_rollout.py``) can be checked against the cost
model step by step, or calibrate one: ``trace_samples`` turns the steps into the same samples that
profiling gives (``psrl.engine_cost.fit``): a decode step (or round) is a sample per decoded step
over its batch's context, a prefill step a sample of its tokens and attention work. Steps that
mixed both, or did nothing, are left out: the model has no term for the one and nothing to fit
in the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from psrl.engine_cost.fit import ProfileSample
from psrl.engine_cost.model import prefill_attention


class StepRecord(NamedTuple):
    seconds: float
    num_decoding: int  # sequences that decoded (a decode round: each up to its round's steps)
    decode_tokens: int
    kv_tokens: int  # the decoding sequences' context before the step
    prefill_tokens: int  # computed this step (prefix-cache hits excluded)
    attended: float  # the prefill's attention work (psrl.engine_cost.model.prefill_attention)


def before_step(scheduler: Any) -> tuple[list[Any], list[tuple[int, bool, bool]]]:
    """An engine scheduler's sequences and each one's (computed tokens, prefilling, waiting), taken just
    before a step for ``step_record``."""
    running = len(scheduler.running)
    seqs = [*scheduler.running, *scheduler.waiting]
    return seqs, [(seq.num_computed_tokens, seq.is_prefilling, i >= running) for i, seq in enumerate(seqs)]


def step_record(seqs: Sequence[Any], before: Sequence[tuple[int, bool, bool]], seconds: float) -> StepRecord:
    """What a step computed, from each sequence's (computed tokens, prefilling, waiting) before it (the
    sequences are the engine's ``psrl.engine.sequence.Sequence`` objects, read after the step)."""
    decoding = decoded = kv = prefilled = 0
    attended = 0.0
    for seq, (computed, prefilling, waiting) in zip(seqs, before, strict=True):
        start = seq.num_cached_tokens if waiting else computed  # admitted this step: its cache hit is not work
        new = seq.num_computed_tokens - start
        if new <= 0:
            continue
        if prefilling or waiting:
            prefilled += new
            attended += prefill_attention(new, start)
        else:
            decoding, decoded, kv = decoding + 1, decoded + new, kv + computed
    return StepRecord(seconds, decoding, decoded, kv, prefilled, attended)


def trace_samples(records: Iterable[StepRecord]) -> list[ProfileSample]:
    """Cost-model samples of the pure decode and pure prefill steps; a decode round of ``m`` steps is one
    sample of its mean step, over the context at its middle."""
    samples = []
    for record in records:
        if record.num_decoding and not record.prefill_tokens:
            steps = max(1, round(record.decode_tokens / record.num_decoding))
            kv = record.kv_tokens + record.num_decoding * steps / 2
            samples.append(ProfileSample(record.num_decoding, kv, record.seconds / steps))
        elif record.prefill_tokens and not record.num_decoding:
            samples.append(ProfileSample(0, 0.0, record.seconds, record.prefill_tokens, record.attended))
    return samples
