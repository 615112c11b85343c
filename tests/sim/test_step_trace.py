"""Recorded engine steps as cost-model samples: decode rounds per step, prefills with their attention, the
rest left out; a model fitted on a run's own steps predicts them."""

from __future__ import annotations

import pytest

from psrl.engine_cost.fit import ProfileSample, fit_cost_model
from psrl.engine_cost.model import CostModel, prefill_attention
from psrl.sim.step_trace import StepRecord, trace_samples

TRUE = CostModel(k1=6e-9, k2=2e-4, k3=2.2e-6, k4=1.8e-3, kp=8e-6, ka=4e-10)


def _round(n: int, kv: int, steps: int) -> StepRecord:
    seconds = sum(TRUE.step_time(n, kv + n * i) for i in range(steps))
    return StepRecord(seconds, n, n * steps, kv, 0, 0.0)


def _prefill(new: int, before: int) -> StepRecord:
    attended = prefill_attention(new, before)
    return StepRecord(TRUE.prefill_time(new, attended), 0, 0, 0, new, attended)


def test_rounds_become_mean_steps_prefills_keep_their_attention_and_mixed_or_idle_steps_are_left_out() -> None:
    samples = trace_samples([_round(4, 1000, 16), _prefill(512, 2048), StepRecord(0.01, 2, 2, 50, 30, 900.0),
                             StepRecord(0.0001, 0, 0, 0, 0, 0.0)])  # fmt: skip
    assert samples[0] == ProfileSample(4, 1000 + 4 * 16 / 2, pytest.approx(_round(4, 1000, 16).seconds / 16))
    assert samples[1] == ProfileSample(0, 0.0, _prefill(512, 2048).seconds, 512, prefill_attention(512, 2048))
    assert len(samples) == 2


def test_a_model_fitted_on_a_runs_steps_predicts_them() -> None:
    records = [_round(n, kv, 16) for n in (1, 8, 32, 64, 80, 96, 112, 128) for kv in (2_000, 50_000, 400_000)]
    records += [_prefill(new, before) for new in (200, 2_000, 8_192) for before in (0, 4_000, 20_000)]
    model = fit_cost_model(trace_samples(records)).model
    for record in records[-9:]:
        assert model.prefill_time(record.prefill_tokens, record.attended) == pytest.approx(record.seconds, rel=0.02)
    assert model.step_time(32, 100_000) == pytest.approx(TRUE.step_time(32, 100_000), rel=0.03)
