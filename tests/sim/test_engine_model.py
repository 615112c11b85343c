"""The modelled engine against a step-by-step reference, and its abort, sync and preemption paths."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest

from psrl.engine_cost.model import CostModel
from psrl.sim.engine_model import FINISHED, EngineRequest, EngineShape, ModelledEngine, SharedDevice, StayResult
from psrl.sim.events import EventQueue

COST = CostModel(k1=2e-7, k2=4e-4, k3=3e-5, k4=8e-4, kp=4e-5)
BIG = EngineShape(max_num_seqs=8, kv_capacity_tokens=10**9, max_num_batched_tokens=64, block_size=16,
                  preemption_loopback_threshold=1024)  # fmt: skip


@dataclass
class Sink:
    results: list[tuple[float, StayResult]] = field(default_factory=list)
    loaded: list[tuple[float, int]] = field(default_factory=list)
    num_changes: int = 0

    def on_result(self, engine: ModelledEngine, result: StayResult, now: float) -> None:
        self.results.append((now, result))

    def on_loaded(self, engine: ModelledEngine, version: int, pull_s: float, now: float) -> None:
        self.loaded.append((now, version))

    def on_changed(self, engine: ModelledEngine, now: float) -> None:
        self.num_changes += 1


def make_engine(shape: EngineShape = BIG) -> tuple[ModelledEngine, EventQueue, Sink]:
    clock, sink = EventQueue(), Sink()
    return ModelledEngine("i0", COST, shape, clock, sink, version=3), clock, sink


def run(clock: EventQueue) -> None:
    while clock.run_next():
        pass


def prefill_time(tokens: int, budget: int) -> float:
    full, rest = divmod(tokens, budget)
    return full * COST.prefill_time(budget) + COST.prefill_time(rest)


def reference(arrivals: list[tuple[float, int, int, int]], shape: EngineShape) -> dict[int, float]:
    """Step by step: commands at step boundaries, prefill first, one token per running request per step; with
    ``shape.decode_steps`` > 1, decode in rounds of that many steps, a request that ends inside one running
    to its end (masked) and leaving then."""
    pending = sorted(arrivals)
    waiting: list[list[int]] = []  # [id, prompt, generated, max]
    running: list[list[int]] = []
    finished: dict[int, float] = {}
    t = 0.0
    while pending or waiting or running:
        while pending and pending[0][0] <= t:
            _, rid, prompt, max_tokens = pending.pop(0)
            waiting.append([rid, prompt, 0, max_tokens])
        admitted = []
        while waiting and len(running) + len(admitted) < shape.max_num_seqs:
            admitted.append(waiting.pop(0))
        if admitted:
            t += prefill_time(sum(r[1] + r[2] for r in admitted), shape.max_num_batched_tokens)
            for r in admitted:
                r[2] += 1
            batch = admitted
        elif running:
            for _ in range(shape.decode_steps):
                t += COST.step_time(len(running), sum(r[1] + r[2] for r in running))
                for r in running:
                    r[2] += 1
            batch = []
        else:
            t = pending[0][0]
            continue
        for r in [*running, *batch]:
            if r[2] >= r[3]:
                finished[r[0]] = t
        running = [r for r in [*running, *batch] if r[2] < r[3]]
    return finished


@pytest.mark.parametrize("rounds", [1, 4, 16])
def test_matches_the_step_by_step_reference(rounds: int) -> None:
    """Rounds (``decode_steps`` > 1): what arrives during one waits for its end, and what ends inside it
    leaves at its end with its tokens."""
    shape = replace(BIG, decode_steps=rounds)
    rng = random.Random(7)
    arrivals = [(rng.uniform(0, 0.05), rid, rng.randint(5, 40), rng.randint(1, 120)) for rid in range(30)]
    engine, clock, sink = make_engine(shape)
    for time, rid, prompt, max_tokens in arrivals:
        request = EngineRequest(rid, prompt, 0, max_tokens, rid)
        clock.at(time, lambda now, r=request: engine.add(now, r))
    run(clock)
    expected = reference(arrivals, shape)
    got = {r.request_id: now for now, r in sink.results}
    assert set(got) == set(expected)
    for rid, when in expected.items():
        assert got[rid] == pytest.approx(when, rel=1e-9, abs=1e-12), rid
    by_id = {r.request_id: r for _, r in sink.results}
    for _, rid, _, max_tokens in arrivals:
        assert by_id[rid].reason == FINISHED and by_id[rid].num_generated == max_tokens
    assert engine.num_unfinished == 0
    if rounds == 1:
        assert engine.counters.num_decode_tokens + 30 == sum(a[3] for a in arrivals)  # 1 token each from prefill
        busy = engine.counters.busy_s
        assert busy == pytest.approx(max(expected.values()) - min(a[0] for a in arrivals), rel=0.2)
    else:
        assert got != reference(arrivals, BIG)  # rounds change when requests get in and out


def test_a_round_the_kv_cannot_hold_falls_back_to_single_steps() -> None:
    tight = replace(BIG, kv_capacity_tokens=64, decode_steps=16)
    engine, clock, sink = make_engine(tight)
    engine.add(0.0, EngineRequest(1, 40, 0, 8, 0))  # after its prefill, room for 7 more tokens: no round of 16
    run(clock)
    ((when, result),) = sink.results
    assert result.num_generated == 8 and engine.counters.num_preemptions == 0
    assert when == pytest.approx(prefill_time(40, 64) + sum(COST.step_time(1, 41 + i) for i in range(7)))


def test_abort_returns_the_tokens_of_whole_steps() -> None:
    engine, clock, sink = make_engine()
    engine.add(0.0, EngineRequest(1, 10, 4, 1000, 0))  # a continuation: 4 prior tokens
    engine.add(0.0, EngineRequest(2, 10, 0, 1000, 1))
    clock.at(0.05, lambda now: engine.abort(now, [1], "migrate"))
    run_until(clock, 0.2)
    (when, result), *_ = sink.results
    assert result.request_id == 1 and result.reason == "migrate"
    first = prefill_time(24, 64)
    steps = result.num_generated - 5  # 4 prior + 1 from the prefill
    assert result.num_generated_here == result.num_generated - 4 and result.version == 3
    assert when == pytest.approx(first + sum(COST.step_time(2, 26 + 2 * i) for i in range(steps)))
    assert first + sum(COST.step_time(2, 26 + 2 * i) for i in range(steps - 1)) < 0.05 <= when
    snap = engine.snapshot(clock.now)
    assert snap.num_running == 1 and snap.num_waiting == 0 and snap.last_dispatch_seq == 1


def run_until(clock: EventQueue, end: float) -> None:
    clock.at(end, lambda now: None)
    while clock.now < end and clock.run_next():
        pass


def test_sync_with_partial_rollout_aborts_then_pulls() -> None:
    engine, clock, sink = make_engine()
    for rid in range(3):
        engine.add(0.0, EngineRequest(rid, 10, 0, 500, rid))
    clock.at(0.02, lambda now: engine.sync(now, 4, 0.1, abort_running=True))
    run(clock)
    assert {r.reason for _, r in sink.results} == {"sync"}
    aborted_at = sink.results[-1][0]
    assert sink.loaded == [(pytest.approx(aborted_at + 0.1), 4)]
    assert engine.version == 4 and engine.counters.num_syncs == 1
    assert engine.snapshot(clock.now).model_version == 4


def test_sync_without_partial_rollout_drains_first() -> None:
    engine, clock, sink = make_engine()
    engine.add(0.0, EngineRequest(0, 10, 0, 50, 0))
    clock.at(0.001, lambda now: engine.sync(now, 4, 0.1, abort_running=False))
    clock.at(0.002, lambda now: engine.sync(now, 2, 0.1, abort_running=True))  # older than loaded: ignored
    run(clock)
    (done_at, result), = sink.results  # fmt: skip
    assert result.reason == FINISHED and result.num_generated == 50
    assert sink.loaded == [(pytest.approx(done_at + 0.1), 4)]


def test_kv_pressure_preempts_and_loops_back_at_threshold_zero() -> None:
    shape = EngineShape(max_num_seqs=8, kv_capacity_tokens=400, max_num_batched_tokens=512, block_size=16,
                        preemption_loopback_threshold=0)  # fmt: skip
    engine, clock, sink = make_engine(shape)
    for rid in range(6):
        engine.add(0.0, EngineRequest(rid, 20, 0, 60, rid))
    run(clock)
    reasons = [r.reason for _, r in sink.results]
    assert "preempted" in reasons and engine.counters.num_preemptions >= 1
    for _, r in sink.results:
        assert r.num_generated == 60 if r.reason == FINISHED else 0 < r.num_generated < 60


def test_kv_pressure_keeps_preempted_requests_under_a_high_threshold() -> None:
    shape = EngineShape(max_num_seqs=8, kv_capacity_tokens=400, max_num_batched_tokens=512, block_size=16,
                        preemption_loopback_threshold=1024)  # fmt: skip
    engine, clock, sink = make_engine(shape)
    for rid in range(6):
        engine.add(0.0, EngineRequest(rid, 20, 0, 60, rid))
    run(clock)
    assert engine.counters.num_preemptions >= 1
    assert sorted(r.request_id for _, r in sink.results) == list(range(6))
    assert all(r.reason == FINISHED and r.num_generated == 60 for _, r in sink.results)
    # recomputation after preemption shows up as extra prefill tokens
    assert engine.counters.num_prefill_tokens > 6 * 20


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError):
        EngineRequest(1, 10, 5, 5, 0)  # nothing left to generate
    engine, clock, _ = make_engine()
    engine.add(0.0, EngineRequest(1, 10, 0, 5, 0))
    engine.add(0.0, EngineRequest(1, 10, 0, 5, 1))
    with pytest.raises(ValueError, match="already in the engine"):
        run(clock)


def test_engines_that_share_a_device_wait_for_each_other_only_while_both_have_work() -> None:
    def finish_s(num_engines: int, device: SharedDevice | None) -> float:
        clock = EventQueue()
        engines = [ModelledEngine(f"i{i}", COST, BIG, clock, Sink(), 3, device) for i in range(num_engines)]
        for index, engine in enumerate(engines):
            engine.add(0.0, EngineRequest(index, 200, 0, 300, 0))
        run(clock)
        return clock.now

    alone = finish_s(1, None)
    assert finish_s(1, SharedDevice()) == pytest.approx(alone)  # nobody else on the device: its own time
    both = finish_s(2, SharedDevice())
    assert 1.8 * alone < both <= 2 * alone + 1e-9  # taking turns: about twice (the first phase planned alone)
    assert finish_s(2, None) == pytest.approx(alone)  # a device each


def test_the_run_decodes_in_rounds_only_with_the_gpu_step_kernels() -> None:
    from psrl.config import load_config
    from psrl.sim.simulation import engine_shape

    def rounds(*overrides: str) -> int:
        return engine_shape(load_config("demo", ["engine.decode_steps=8", *overrides])).decode_steps

    assert rounds("topology.device=cuda") == 8
    assert rounds("topology.device=cpu") == rounds("topology.device=cuda", "engine.gpu_kernels=off") == 1
