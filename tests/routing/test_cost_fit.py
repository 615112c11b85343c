"""Cost model: fitting from profiled steps, prefill, and the JSON document."""

from __future__ import annotations

import json
import random

import pytest

from psrl.engine_cost.fit import ProfileSample, fit_cost_model, load_samples, save_samples
from psrl.engine_cost.model import CostModel, CostModelError, load_cost_model, prefill_attention

TRUE = CostModel(3.35e-8, 0.0064, 1.231e-4, 0.0028, kp=2.0e-5)  # kink at n* = 52


def profile(model: CostModel, sizes: list[int], *, noise: float = 0.01, seed: int = 0) -> list[ProfileSample]:
    rng = random.Random(seed)
    samples = []
    for n in sizes:
        for kv in (0, 30_000, 120_000, 400_000):
            samples.append(ProfileSample(n, kv, model.step_time(n, kv) * (1 + rng.gauss(0, noise))))
    return samples


def test_recovers_the_coefficients_and_the_kink_from_noisy_steps() -> None:
    report = fit_cost_model(profile(TRUE, [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]), meta={"gpu": "test"})
    m = report.model
    assert m.k1 == pytest.approx(TRUE.k1, rel=0.1)
    assert m.k3 == pytest.approx(TRUE.k3, rel=0.1)
    assert m.k2 + m.k4 == pytest.approx(TRUE.k2 + TRUE.k4, rel=0.05)
    assert report.breakpoint == pytest.approx(52, rel=0.15) and report.is_kink_observed
    assert report.mean_abs_pct_error < 0.02 and report.r2 > 0.99
    assert m.meta == {"gpu": "test"}
    assert "breakpoint" in report.summary()


def test_exact_data_fits_exactly() -> None:
    report = fit_cost_model(profile(TRUE, [1, 8, 16, 40, 64, 100, 200], noise=0.0))
    assert report.rmse_s < 1e-9
    assert report.breakpoint == pytest.approx(TRUE.k2 / TRUE.k3, rel=1e-3)


def test_a_profile_below_the_kink_reports_it_as_extrapolated() -> None:
    report = fit_cost_model(profile(TRUE, [1, 4, 8, 16, 32], noise=0.0))
    assert not report.is_kink_observed
    for n in (1, 16, 32):  # still predicts what it saw
        assert report.model.step_time(n, 30_000) == pytest.approx(TRUE.step_time(n, 30_000), rel=1e-6)


def test_prefill_cost_is_fitted_from_prefill_steps() -> None:
    samples = profile(TRUE, [1, 16, 64, 128], noise=0.0)
    samples += [ProfileSample(8, 10_000, TRUE.step_time(8, 10_000) + TRUE.kp * t, t) for t in (512, 2048, 8192)]
    model = fit_cost_model(samples).model
    assert model.kp == pytest.approx(TRUE.kp, rel=1e-3)
    assert model.prefill_time(1000) == pytest.approx(TRUE.kp * 1000 + model.k4, rel=1e-3)
    unprofiled = CostModel(model.k1, model.k2, model.k3, model.k4)
    assert unprofiled.prefill_time(1000) == pytest.approx(max(model.k2, model.k3 * 1000) + model.k4)


def _chunked_prefills(model: CostModel, contexts: list[int], chunk: int = 2048) -> list[ProfileSample]:
    """Fresh prefills of each context in chunks, one step each, as a profile records them."""
    samples = []
    for context in contexts:
        for start in range(0, context, chunk):
            new = min(chunk, context - start)
            attended = prefill_attention(new, start)
            samples.append(ProfileSample(0, 0.0, model.prefill_time(new, attended), new, attended))
    return samples


def test_the_attention_cost_of_prefill_is_told_apart_from_the_per_token_cost() -> None:
    true = CostModel(TRUE.k1, TRUE.k2, TRUE.k3, TRUE.k4, kp=8.0e-6, ka=4.0e-10)
    samples = profile(true, [1, 16, 64, 128], noise=0.0) + _chunked_prefills(true, [500, 2048, 8000, 30_000])
    model = fit_cost_model(samples).model
    assert model.kp == pytest.approx(true.kp, rel=1e-3) and model.ka == pytest.approx(true.ka, rel=1e-3)
    # 1,000 new tokens after a 15,000-token cached prefix cost more than a fresh 1,000-token prompt
    after_prefix = model.prefill_time(1000, prefill_attention(1000, 15_000))
    assert after_prefix == pytest.approx(true.kp * 1000 + true.ka * 1000 * (15_000 + 500.5) + true.k4, rel=1e-3)
    assert after_prefix - model.k4 > 1.5 * (model.prefill_time(1000) - model.k4)
    flat = fit_cost_model(profile(TRUE, [1, 16, 64, 128], noise=0.0) + _chunked_prefills(TRUE, [500, 8000])).model
    assert flat.ka == pytest.approx(0.0, abs=1e-15) and flat.kp == pytest.approx(TRUE.kp, rel=1e-3)


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([ProfileSample(4, 0, 0.01)] * 3, "at least 4"),
        ([ProfileSample(4, k, 0.01) for k in range(6)], "two batch sizes"),
        ([ProfileSample(n, 0, 0.01) for n in (1, 2, 3)] + [ProfileSample(0, 0, 0.01)], "unusable sample"),
        ([ProfileSample(n, 0, -1.0) for n in (1, 2, 3, 4)], "unusable sample"),
    ],
)
def test_unusable_profiles_are_refused(samples: list[ProfileSample], message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        fit_cost_model(samples)


def test_json_round_trip_and_validation(tmp_path) -> None:
    model = fit_cost_model(profile(TRUE, [1, 16, 64, 128]), meta={"engine": "embedded"}).model
    path = tmp_path / "cost.json"
    model.save(path)
    assert load_cost_model(path) == model == CostModel.load(path)
    assert CostModel.from_json(model.to_json()) == model
    bad = json.loads(model.to_json())
    bad["kp"] = -1.0
    with pytest.raises(CostModelError, match="kp"):
        CostModel.from_json(json.dumps(bad))
    legacy = {k: v for k, v in json.loads(model.to_json()).items() if k not in ("kp", "ka")}  # files without them
    assert (CostModel.from_json(json.dumps(legacy)).kp, CostModel.from_json(json.dumps(legacy)).ka) == (0.0, 0.0)
    with_attention = CostModel(model.k1, model.k2, model.k3, model.k4, kp=1e-5, ka=3e-10)
    assert CostModel.from_json(with_attention.to_json()) == with_attention
    with pytest.raises(CostModelError, match="does not exist"):
        load_cost_model(tmp_path / "missing.json")


def test_marginal_gains_match_the_scalar_formula() -> None:
    loads = [(0, 0.0), (10, 5_000.0), (52, 60_000.0), (200, 300_000.0)]
    assert TRUE.marginal_gains(loads, 700) == pytest.approx([TRUE.marginal_gain(n, kv, 700) for n, kv in loads])


def test_profiled_steps_round_trip_through_json_lines(tmp_path) -> None:
    samples = [*profile(TRUE, [1, 16]), ProfileSample(4, 100.0, 0.02, 512, 131_328.0)]
    path = tmp_path / "steps.jsonl"
    save_samples(samples, path)
    assert load_samples(path) == samples
    path.write_text(path.read_text() + '["four", 1, 1]\n')
    with pytest.raises(CostModelError, match=r"steps.jsonl:10"):
        load_samples(path)
    path.write_text("[4, 100.0, 0.02, 512]\n")  # written before the attention was recorded
    assert load_samples(path) == [ProfileSample(4, 100.0, 0.02, 512, 0.0)]


def test_steps_proportional_to_the_batch_fit_without_claiming_an_empty_step_is_free() -> None:
    # y = k3 * n + k1 * kv exactly: any breakpoint up to the smallest batch fits; the fit takes that batch
    samples = [ProfileSample(n, kv, 0.002 * n + 1e-7 * kv) for n in (4, 8, 16, 32) for kv in (1_000, 8_000)]
    report = fit_cost_model(samples)
    assert report.breakpoint == pytest.approx(4)
    assert report.model.k2 == pytest.approx(0.008, rel=1e-3) and report.model.k2 + report.model.k4 > 0
    assert report.model.step_time(16, 8_000) == pytest.approx(0.002 * 16 + 1e-7 * 8_000, rel=1e-3)
