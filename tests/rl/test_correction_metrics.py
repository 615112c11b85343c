"""What the correction reports: fractions, the k3 KL by staleness, quantiles across ranks' sums, and the
certificate's record of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bus.messages import StalenessCertificate, TrainData
from psrl.evaluation.certificate import build, is_plausible, masked_by_trajectory
from psrl.rl.batch import Sample
from psrl.rl.correction import CorrectionSpec, correct
from psrl.rl.correction_stats import correction_metrics, k3, token_staleness
from psrl.rl.trajectory import Trajectory
from psrl.trainer.metrics import QUANTILES, MetricSums
from psrl.trainer.parallel import ParallelContext


def test_k3_is_the_kl_of_sampler_to_trainer() -> None:
    # sampler q = (0.5, 0.5), trainer p = (0.8, 0.2): E_q[p/q - 1 - log(p/q)] = KL(q || p)
    q, p = np.array([0.5, 0.5]), np.array([0.8, 0.2])
    estimate = float((q * k3(torch.tensor(np.log(p / q))).numpy()).sum())
    assert estimate == pytest.approx(float((q * np.log(q / p)).sum()), rel=1e-12)
    assert float(k3(torch.zeros(1))) == 0.0


def test_fractions_and_kl_by_staleness() -> None:
    old = torch.log(torch.tensor([[1.0, 8.0, 1.0], [0.3, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64))
    rollout = torch.zeros_like(old)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    spec = CorrectionSpec(is_level="token", is_upper=2.0, rs_level="token", rs_upper=5.0, rs_lower=0.5)
    result = correct(old, rollout, mask, spec)
    staleness = torch.tensor([[1, 1, 1], [3, 3, 3], [0, 0, 0]])
    metrics = correction_metrics(result, mask, staleness)
    assert metrics["rollout_corr/token_truncated_frac"] == (pytest.approx(1 / 5), 5.0)
    assert metrics["rollout_corr/token_masked_frac"] == (pytest.approx(2 / 5), 5.0)  # 8 above 5, 0.3 below 0.5
    assert metrics["rollout_corr/seq_masked_frac"] == (pytest.approx(1.0), 2.0)  # the empty row is not counted
    assert metrics["rollout_corr/seq_truncated_frac"] == (pytest.approx(0.5), 2.0)
    kl1 = (8 - 1 - math.log(8)) / 2
    kl3 = (0.3 - 1 - math.log(0.3)) / 3
    assert metrics["rollout_corr/kl_k3/staleness_1"][0] == pytest.approx(kl1)
    assert metrics["rollout_corr/kl_k3/staleness_3"][0] == pytest.approx(kl3)
    assert "rollout_corr/kl_k3/staleness_0" not in metrics


def test_token_staleness_falls_back_to_the_trajectory_version() -> None:
    got = token_staleness(5, torch.tensor([[3, 4, -1], [-1, -1, -1]]), torch.tensor([3, 2]))
    assert got.tolist() == [[2, 1, 2], [3, 3, 3]]


def test_metric_sums_sparse_keys_and_quantiles() -> None:
    sums = MetricSums()
    sums.add_sparse("a", 0.0, 0.0)
    sums.add_sparse("b", 2.0, 3.0)
    values = torch.arange(1, 101, dtype=torch.float64)
    sums.add_pooled("r", values[:40])
    sums.add_pooled("r", values[40:])
    sums.add_pooled("empty", torch.zeros(0))
    out = sums.reduce(ParallelContext())
    assert "a" not in out and out["b"] == 2.0
    for q in QUANTILES:
        assert out[f"r_q{round(100 * q):02d}"] == pytest.approx(float(torch.quantile(values, q)))
    assert not any(k.startswith("empty") for k in out)


def _sample(prompt_id: int, child: int, accept: list[float] | None, loss_mask: tuple[int, ...] = ()) -> Sample:
    n = 4
    t = Trajectory(prompt_id, child, (1,), tuple(range(n)), (-1.0,) * n, (0,) * n, 0, 1.0, loss_mask=loss_mask)
    fields = {} if accept is None else {"rs_accept": torch.tensor(accept)}
    return Sample(t, fields)


def test_masked_by_trajectory_counts_trained_tokens() -> None:
    samples = [_sample(0, 0, [1, 0, 0, 1]), _sample(0, 1, [1, 0, 0, 0], loss_mask=(1, 1, 0, 0)),
               _sample(1, 0, None), _sample(1, 1, [0, 0, 0, 0], loss_mask=(0, 0, 0, 0))]  # fmt: skip
    assert masked_by_trajectory(samples) == {(0, 0): 0.5, (0, 1): 0.5}


def _chunk() -> TrainData:
    i32 = np.int32
    return TrainData(step=4, buffer=3, chunk=0, num_chunks=1, request_ids=np.asarray([0, 1], i32),
                     prompt_ids=np.asarray([0, 0], i32), prompt_token_ids=np.asarray([1, 1], i32),
                     prompt_lengths=np.asarray([1, 1], i32), response_token_ids=np.asarray([5, 6], i32),
                     response_lengths=np.asarray([1, 1], i32), response_logprobs=np.asarray([-1, -1], np.float32),
                     response_versions=np.asarray([2, 2], i32), v_traj=np.asarray([2, 2], i32),
                     rewards=np.asarray([1, 0], np.float32), accs=np.asarray([1, 0], np.float32),
                     finish_reasons=np.asarray([0, 0], i32))  # fmt: skip


def test_certificate_carries_the_correction() -> None:
    cert = build([_chunk()], 4, {(0, 0): (1.2, 0.0)}, responses_per_prompt=2, threshold=2.0,
                 masked={(0, 1): 0.25}, correction="is=token[-,2];rs=token[0.5,5]")  # fmt: skip
    assert cert.correction == "is=token[-,2];rs=token[0.5,5]"
    assert cert.masked_frac is not None and np.isnan(cert.masked_frac[0]) and cert.masked_frac[1] == 0.25
    assert is_plausible(cert)
    bad = StalenessCertificate(**{**{f: getattr(cert, f) for f in cert.__struct_fields__},
                                  "masked_frac": np.asarray([1.5, 0.0], np.float32)})  # fmt: skip
    assert not is_plausible(bad)
    old = StalenessCertificate(**{f: getattr(cert, f) for f in cert.__struct_fields__[:10]})
    assert old.masked_frac is None and old.correction == "" and is_plausible(old)  # a 1.7 certificate
