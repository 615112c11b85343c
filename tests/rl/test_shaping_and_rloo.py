"""RLOO advantages, DAPO overlong shaping and how the objective applies them, against the reference."""

from __future__ import annotations

import pytest
import torch

from psrl.config import load_config
from psrl.rl.advantages import rloo_advantages
from psrl.rl.batch import Sample, collate
from psrl.rl.objective import compute_advantages, shaped_rewards, token_weights
from psrl.rl.shaping import overlong_penalty
from psrl.rl.trajectory import Trajectory

from . import reference


def test_rloo_matches_the_leave_one_out_reference() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(11, generator=g)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 0])  # group 2 has one member
    mask = torch.ones(11, 3)
    mask[4] = 0.0
    adv = rloo_advantages(rewards, groups, mask)
    expected = torch.tensor(reference.rloo(rewards.tolist(), groups.tolist()))
    torch.testing.assert_close(adv[:, 0], torch.where(mask[:, 0] > 0, expected, torch.zeros(11)))
    assert adv[5].abs().sum() == 0.0 and adv[4].abs().sum() == 0.0


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_overlong_penalty_matches_dapo(factor: float) -> None:
    lengths = torch.tensor([0, 1, 19, 20, 21, 23, 24])
    got = overlong_penalty(lengths, max_length=24, buffer_len=4, penalty_factor=factor)
    expected = [reference.overlong(n, 24, 4, factor) for n in lengths.tolist()]
    torch.testing.assert_close(got, torch.tensor(expected))
    assert got[3] == 0.0 and got[-1] == pytest.approx(-factor)  # starts at max - len, full at max


def trajectory(prompt_id: int, child: int, reward: float, length: int) -> Trajectory:
    response = tuple(range(5, 5 + length))
    return Trajectory(prompt_id, child, (1, 2), response, tuple(-0.5 for _ in response), tuple(0 for _ in response),
                      0, reward)  # fmt: skip


def test_objective_shapes_then_estimates() -> None:
    config = load_config("demo", ["algorithm.overlong_buffer.enable=true", "algorithm.overlong_buffer.len=4",
                                  "algorithm.adv_estimator=rloo"])  # fmt: skip
    samples = [Sample(trajectory(0, 0, 1.0, 24)), Sample(trajectory(0, 1, 1.0, 3))]
    batch, penalty = shaped_rewards(collate(samples, 0), config.algorithm, 24)
    assert penalty is not None and penalty.tolist() == [-1.0, 0.0]
    adv, _ = compute_advantages(batch, config.algorithm)
    assert adv[0, 0].item() == pytest.approx(-1.0) and adv[1, 0].item() == pytest.approx(1.0)
    off = load_config("demo").algorithm
    assert shaped_rewards(collate(samples, 0), off, 24)[1] is None


def test_token_weights_combine_is_and_rejection() -> None:
    batch = collate([Sample(trajectory(0, 0, 1.0, 2), {"is_weights": torch.tensor([0.5, 2.0])})], 0)
    assert token_weights(batch) is batch.fields["is_weights"]
    both = collate([Sample(trajectory(0, 0, 1.0, 2), {"is_weights": torch.tensor([0.5, 2.0]),
                                                      "rs_accept": torch.tensor([1.0, 0.0])})], 0)  # fmt: skip
    weights = token_weights(both)
    assert weights is not None and weights.tolist() == [[0.5, 0.0]]
    only = collate([Sample(trajectory(0, 0, 1.0, 2), {"rs_accept": torch.tensor([0.0, 1.0])})], 0)
    weights = token_weights(only)
    assert weights is not None and weights.tolist() == [[0.0, 1.0]]
    assert token_weights(collate([Sample(trajectory(0, 0, 1.0, 2))], 0)) is None
