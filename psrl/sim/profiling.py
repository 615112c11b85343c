"""Profiling an engine's decode steps for the cost model (what ``psrl calibrate`` measures).

For every point of a grid of batch sizes and KV usages, ``n`` requests of ``c`` context tokens
are started with forced lengths (``min_tokens`` + ``ignore_eos``, so none ends early), prefilled,
decoded a few warm-up steps, and then a number of decode steps is timed one by one. The grid is
walked ``num_repeats`` times, so a burst of load from another process hits different points on
different passes. A point's sample is the lower quartile of its pooled step times at their mean
KV token count: other processes only ever add time to a step, so the low quantile is the
engine's own cost, while the quartile (rather than the minimum) ignores lucky outliers. Prefill
steps are recorded too, as samples with ``num_prefill_tokens`` and the work of their attention,
so the fit can estimate the prefill's cost per token and per token of context attended to.

KV usage is set per point as a fraction of the engine's KV capacity: ``c = fraction x capacity
/ n``, clipped to what the context limit allows; points that collapse onto the same context are
measured once.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psrl.engine import Engine, SamplingParams
from psrl.engine_cost.fit import ProfileSample
from psrl.sim.step_trace import before_step, step_record

Clock = Callable[[], float]


@dataclass(frozen=True)
class ProfileGrid:
    batch_sizes: tuple[int, ...]
    kv_fractions: tuple[float, ...]  # KV usage targets as fractions of the KV capacity
    num_timed_steps: int
    num_warmup_steps: int
    num_repeats: int  # each point is measured this many times; its steps are pooled

    @classmethod
    def default(cls) -> ProfileGrid:
        return cls((1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256), (0.02, 0.1, 0.3, 0.6, 0.85), 16, 3, 3)

    @classmethod
    def quick(cls) -> ProfileGrid:
        return cls((1, 4, 16, 64), (0.02, 0.3), 6, 2, 1)


@dataclass(frozen=True)
class GridPoint:
    num_running: int
    context_tokens: int  # per request when the timed steps start


@dataclass(frozen=True)
class PointResult:
    point: GridPoint
    sample: ProfileSample
    step_times_s: tuple[float, ...]


@dataclass(frozen=True)
class EngineLimits:
    max_num_seqs: int
    kv_capacity_tokens: int
    max_model_len: int
    block_size: int
    steps_per_call: int = 1  # decode steps one `Engine.step()` runs (several with decode rounds)

    @classmethod
    def of(cls, engine: Engine) -> EngineLimits:
        status = engine.status()
        return cls(
            engine.args.max_num_seqs,
            status.kv_capacity_tokens,
            engine.max_model_len,
            engine.args.block_size,
            steps_per_call(engine),
        )


def steps_per_call(engine: Engine) -> int:
    return engine.args.decode_steps if engine.runner.rounds is not None else 1


def tokens_grown(grid: ProfileGrid, limits: EngineLimits) -> int:
    """Tokens each request grows by while its point is measured (prefill's first token included)."""
    return (grid.num_warmup_steps + grid.num_timed_steps + 2) * limits.steps_per_call


def grid_points(grid: ProfileGrid, limits: EngineLimits) -> list[GridPoint]:
    """The (batch size, context) points that fit the engine, without duplicates, smallest first."""
    extra = tokens_grown(grid, limits)
    sizes = sorted({n for n in (*grid.batch_sizes, limits.max_num_seqs) if 1 <= n <= limits.max_num_seqs})
    points: list[GridPoint] = []
    for n in sizes:
        # Every request holds whole KV blocks: leave one block of slack per request.
        per_request_room = limits.kv_capacity_tokens // n - extra - limits.block_size
        longest = min(limits.max_model_len - extra - 1, per_request_room)
        if longest < 1:
            continue
        contexts = sorted({max(1, min(longest, int(f * limits.kv_capacity_tokens / n))) for f in grid.kv_fractions})
        points.extend(GridPoint(n, c) for c in contexts)
    return points


def profile_engine(
    engine: Engine,
    grid: ProfileGrid,
    *,
    seed: int = 0,
    clock: Clock = time.perf_counter,
    on_point: Callable[[PointResult], None] | None = None,
) -> tuple[list[PointResult], list[ProfileSample]]:
    """Measure every grid point; returns the decode points and the prefill samples."""
    if engine.has_unfinished_requests():
        raise ValueError("profile an idle engine: it still has requests")
    limits = EngineLimits.of(engine)
    rng = random.Random(seed)
    points = grid_points(grid, limits)
    times: list[list[float]] = [[] for _ in points]
    kv: list[list[int]] = [[] for _ in points]
    prefill: list[ProfileSample] = []
    for _ in range(grid.num_repeats):
        for index, point in enumerate(points):
            step_times, kv_tokens, prefill_samples = _measure(engine, point, grid, limits, rng, clock)
            times[index] += step_times
            kv[index] += kv_tokens
            prefill += prefill_samples
    results = []
    for point, point_times, point_kv in zip(points, times, kv, strict=True):
        sample = ProfileSample(point.num_running, statistics.fmean(point_kv), lower_quartile(point_times))
        results.append(PointResult(point, sample, tuple(point_times)))
        if on_point is not None:
            on_point(results[-1])
    return results, prefill


def lower_quartile(values: Sequence[float]) -> float:
    """The 25th percentile (linear interpolation); the single value for one value."""
    if not values:
        raise ValueError("no values")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=4, method="inclusive")[0]


def _measure(
    engine: Engine, point: GridPoint, grid: ProfileGrid, limits: EngineLimits, rng: random.Random, clock: Clock
) -> tuple[list[float], list[int], list[ProfileSample]]:
    """One pass over a point: start its requests, prefill, warm up, time decode steps, abort.

    With decode rounds (several steps per `Engine.step()`), a round's time is divided by its steps.
    """
    num_tokens = tokens_grown(grid, limits)
    params = SamplingParams(max_tokens=num_tokens, min_tokens=num_tokens, ignore_eos=True)
    vocab = engine.spec.vocab_size
    ids = [f"profile-{rng.getrandbits(48):x}-{i}" for i in range(point.num_running)]
    for request_id in ids:
        # Random prompts: identical prefixes would hit the prefix cache and skip prefill work.
        prompt = [rng.randrange(vocab) for _ in range(point.context_tokens)]
        engine.add_request(request_id, prompt, params)
    try:
        prefill = _prefill(engine, point.num_running, clock)
        for _ in range(grid.num_warmup_steps):
            engine.step()
        step_times, kv_tokens = [], []
        for _ in range(grid.num_timed_steps):
            kv_tokens.append(engine.status().num_kv_tokens)
            started = clock()
            out = engine.step()
            elapsed = clock() - started
            step_times.append(elapsed / max((len(o.token_ids) for o in out.outputs), default=1))
            if len(out.outputs) != point.num_running:
                raise RuntimeError(
                    f"profiling step decoded {len(out.outputs)} of {point.num_running} requests: "
                    "the point does not fit the engine (KV preemption)"
                )
        return step_times, kv_tokens, prefill
    finally:
        engine.abort_all()


def _prefill(engine: Engine, num_requests: int, clock: Clock) -> list[ProfileSample]:
    """Step until every request has its first token; each step is a prefill sample, with the work of its
    attention (each sequence's new tokens over what it had computed before the step)."""
    samples = []
    while True:
        seqs, before = before_step(engine.scheduler)
        started = clock()
        out = engine.step()
        elapsed = clock() - started
        attended = step_record(seqs, before, elapsed).attended
        samples.append(ProfileSample(0, 0.0, elapsed, out.num_computed_tokens, attended))
        if engine.status().num_waiting == 0 and not any(seq.is_prefilling for seq in engine.scheduler.running):
            return samples
        if out.num_computed_tokens == 0:
            raise RuntimeError(f"the engine stopped making progress prefilling {num_requests} requests")


def point_table(results: Sequence[PointResult], predict: Callable[[int, float], float], capacity: int) -> list[str]:
    """Rows ``n | kv tokens | kv usage | measured ms | model ms | error`` for the console."""
    rows = [f"{'n':>5} {'kv tokens':>10} {'kv use':>7} {'measured ms':>12} {'model ms':>9} {'error':>7}"]
    for result in results:
        sample = result.sample
        predicted = predict(sample.num_running, sample.kv_tokens)
        error = (predicted - sample.step_time_s) / sample.step_time_s
        usage = sample.kv_tokens / capacity if capacity else 0.0
        rows.append(
            f"{sample.num_running:>5} {sample.kv_tokens:>10.0f} {usage:>7.1%} "
            f"{sample.step_time_s * 1e3:>12.3f} {predicted * 1e3:>9.3f} {error:>+7.1%}"
        )
    return rows
