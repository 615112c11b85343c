"""The trainer applies the configured correction and loss: weights and masks reach the loss, metrics and
the per-trajectory record come out, and the defaults train exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from psrl.trainer import TrainerCore
from tests.trainer.trainer_helpers import make_buffer, trainer_config, write_tiny_model

RC = "algorithm.rollout_correction."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_rc"))


def train(model_dir: Path, overrides: list[str], buffers: int = 2) -> tuple[TrainerCore, list]:
    core = TrainerCore(trainer_config(overrides), model_dir=model_dir)
    results = [core.train_buffer(b, make_buffer(b)) for b in range(buffers)]
    return core, results


def test_icepop_masks_tokens_and_reports_it(model_dir: Path) -> None:
    # the synthetic engine log-probs are far from the tiny model's, so a narrow band rejects many tokens
    _, results = train(model_dir, [f"{RC}rollout_is=null", f"{RC}rollout_rs=token", f"{RC}rollout_rs_threshold=1.5"])
    metrics = results[-1].metrics
    assert 0.0 < metrics["rollout_corr/token_masked_frac"] <= 1.0
    assert metrics["rollout_corr/kl_k3"] > 0.0 and "rollout_is/mean" not in metrics
    assert metrics["rollout_corr/ratio_q01"] <= metrics["rollout_corr/ratio_q50"] <= metrics["rollout_corr/ratio_q99"]
    assert any(k.startswith("rollout_corr/kl_k3/staleness_") for k in metrics)
    masked = results[-1].trajectory_masked
    assert masked and all(0.0 <= v <= 1.0 for v in masked.values()) and max(masked.values()) > 0.0


def test_rejecting_everything_freezes_the_policy(model_dir: Path) -> None:
    """With every response vetoed (some token of each has a ratio below 0.999) the update is zero."""
    core = TrainerCore(trainer_config([f"{RC}rollout_is=null", f"{RC}rollout_token_veto_threshold=0.999",
                                       "actor.weight_decay=0"]), model_dir=model_dir)  # fmt: skip
    before = {n: t.clone() for n, t in core.named_weights()}
    result = core.train_buffer(0, make_buffer(0))
    assert result.metrics["rollout_corr/seq_vetoed_frac"] == 1.0
    assert all(torch.equal(before[n], t) for n, t in core.named_weights())


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.policy_loss.loss_mode=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean"],
        ["algorithm.policy_loss.loss_mode=cispo", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
        [f"{RC}rollout_is=sequence", f"{RC}rollout_rs=geometric", f"{RC}rollout_rs_threshold=3",
         "algorithm.policy_loss.clip_ratio_c=3", "algorithm.adv_estimator=rloo"],
    ],
)  # fmt: skip
def test_losses_train(model_dir: Path, overrides: list[str]) -> None:
    core, results = train(model_dir, overrides)
    assert core.version == 2
    for result in results:
        assert torch.isfinite(torch.tensor(result.metrics["actor/pg_loss"]))
        assert result.metrics["actor/grad_norm"] > 0.0


def test_overlong_penalty_is_reported(model_dir: Path) -> None:
    _, results = train(model_dir, ["algorithm.overlong_buffer.enable=True", "algorithm.overlong_buffer.len=4",
                                   "task.max_response_length=8"], buffers=1)  # fmt: skip
    assert results[0].metrics["reward/overlong_penalty_mean"] < 0.0  # responses of up to 7 tokens enter the buffer
