"""A buffer's first mini-batch takes its old log-probs from its own update's forward
(`actor.fuse_old_log_probs`): the same step as running the no-grad forward first, one forward fewer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from psrl.trainer import TrainerCore
from psrl.trainer import core as core_module

from .trainer_helpers import make_buffer, trainer_config

# metrics the old log-probs feed: the loss, the correction and the trainer/engine mismatch
COMPARED = (
    "actor/pg_loss",
    "actor/clip_frac",
    "actor/grad_norm",
    "rollout_is/mean",
    "rollout_is/max",
    "rollout_is/truncated_frac",
    "rollout_corr/kl_k3",
    "rollout/log_prob_abs_diff",
)
REJECTION = [
    "algorithm.rollout_correction.rollout_rs=token",
    "algorithm.rollout_correction.rollout_rs_threshold=1.5",
    "algorithm.rollout_correction.rollout_rs_threshold_lower=0.5",
]


def _weights(core: TrainerCore) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in core.named_weights()}


def _policy_forwards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Samples each launched no-grad policy forward ran on (one entry per launch)."""
    launched: list[int] = []
    real = core_module.run_forwards

    def recording(samples: list[object], *args: object, with_policy: bool = True, **kwargs: object) -> object:
        if with_policy:
            launched.append(len(samples))
        return real(samples, *args, with_policy=with_policy, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(core_module, "run_forwards", recording)
    return launched


def _train(model_dir: Path, overrides: list[str], buffers: int = 3) -> tuple[TrainerCore, list[dict[str, float]]]:
    core = TrainerCore(trainer_config(overrides), model_dir=model_dir)
    return core, [core.train_buffer(b, make_buffer(b)).metrics for b in range(buffers)]


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor.ppo_mini_batch_size=4"],  # the buffer is one mini-batch: no separate policy forward at all
        ["actor.ppo_mini_batch_size=2"],  # two mini-batches: the second keeps its no-grad forward
        ["actor.ppo_mini_batch_size=2", "algorithm.kl_loss_coef=0.1"],  # the reference forward still runs
        ["actor.ppo_mini_batch_size=2", "algorithm.adv_estimator=gae"],  # and the critic's
        ["actor.ppo_mini_batch_size=4", "actor.packing=false"],
        ["actor.ppo_mini_batch_size=4", *REJECTION],
    ],
)
def test_the_same_steps_as_a_separate_forward(tiny_model_dir: Path, overrides: list[str]) -> None:
    fused, fused_metrics = _train(tiny_model_dir, overrides)
    separate, separate_metrics = _train(tiny_model_dir, [*overrides, "actor.fuse_old_log_probs=false"])
    for mine, theirs in zip(fused_metrics, separate_metrics, strict=True):
        for name in COMPARED + (("rollout_corr/token_masked_frac",) if REJECTION[0] in overrides else ()):
            assert mine[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), name
    a, b = _weights(fused), _weights(separate)
    worst = max(float((a[name] - b[name]).abs().max()) for name in a)
    assert worst < 1e-6, f"weights differ by up to {worst}"


@pytest.mark.parametrize(("mini", "expected"), [(4, 0), (2, 4)])
def test_the_first_mini_batch_runs_no_policy_forward(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, mini: int, expected: int
) -> None:
    launched = _policy_forwards(monkeypatch)
    core = TrainerCore(trainer_config([f"actor.ppo_mini_batch_size={mini}"]), model_dir=tiny_model_dir)
    result = core.train_buffer(0, make_buffer(0))
    assert sum(launched) == expected  # 4 groups of 2 samples; the first `mini` groups are the update's
    assert len(result.trajectory_is) == 8  # every trajectory's correction was still measured


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor.fuse_old_log_probs=false"],
        ["actor.ppo_epochs=2"],  # later passes need the old log-probs before the first update
        ["psrl.fine_grain_overlap.granularity=mini_batch", "psrl.fine_grain_overlap.overlap_scope=pre_step"],
    ],
)
def test_every_policy_forward_runs_where_it_cannot_apply(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]
) -> None:
    launched = _policy_forwards(monkeypatch)
    core = TrainerCore(trainer_config(["actor.ppo_mini_batch_size=2", *overrides]), model_dir=tiny_model_dir)
    core.train_buffer(0, make_buffer(0))
    assert sum(launched) == 8


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["actor.ppo_epochs=2"], "actor.ppo_epochs"),
        (["psrl.fine_grain_overlap.granularity=mini_batch", "psrl.fine_grain_overlap.overlap_scope=pre_step"],
         "psrl.fine_grain_overlap.overlap_scope"),
    ],
)  # fmt: skip
def test_an_explicit_true_where_it_cannot_apply_is_refused_before_launch(overrides: list[str], named: str) -> None:
    from psrl.errors import ConfigError

    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        trainer_config(["actor.ppo_mini_batch_size=2", "actor.fuse_old_log_probs=true", *overrides])
    assert trainer_config(["actor.ppo_mini_batch_size=2", *overrides]).actor.fuse_old_log_probs == "auto"
