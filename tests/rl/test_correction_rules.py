"""Invalid rollout-correction and policy-loss settings are refused before launch, naming field, value and fix."""

from __future__ import annotations

import pytest

from psrl.config import load_config
from psrl.errors import ConfigError

RC = "algorithm.rollout_correction."
PL = "algorithm.policy_loss."
NO_ENGINE = "psrl.log_prob.enable_rollout_engine_log_prob=False"


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config("demo", list(overrides))
    return str(info.value)


@pytest.mark.parametrize(
    "setting",
    [f"{RC}rollout_is=token", f"{RC}rollout_is=sequence", f"{RC}rollout_is=geometric", f"{RC}bypass_mode=True",
     f"{RC}rollout_token_veto_threshold=0.0001"],
)  # fmt: skip
def test_every_correction_needs_engine_logprobs(setting: str) -> None:
    msg = refused(f"{RC}rollout_is=null", setting, NO_ENGINE)
    assert setting.split("=", maxsplit=1)[0] in msg and "enable_rollout_engine_log_prob=True" in msg


def test_rejection_needs_engine_logprobs() -> None:
    msg = refused(f"{RC}rollout_is=null", f"{RC}rollout_rs=token", f"{RC}rollout_rs_threshold=5", NO_ENGINE)
    assert f"{RC}rollout_rs" in msg and "'token'" in msg


def test_rejection_needs_its_upper_bound() -> None:
    msg = refused(f"{RC}rollout_rs=sequence")
    assert f"{RC}rollout_rs_threshold" in msg and "set" in msg


@pytest.mark.parametrize("bound", ["rollout_rs_threshold=5", "rollout_rs_threshold_lower=0.5"])
def test_rejection_bound_without_rejection(bound: str) -> None:
    assert "a rejection bound without rejection" in refused(RC + bound)


@pytest.mark.parametrize(("upper", "lower"), [("0.9", "0.5"), ("2", "1.5"), ("2", "1")])
def test_band_must_contain_one(upper: str, lower: str) -> None:
    msg = refused(
        f"{RC}rollout_rs=token", f"{RC}rollout_rs_threshold={upper}", f"{RC}rollout_rs_threshold_lower={lower}"
    )
    assert "must contain ratio 1" in msg


def test_truncation_bounds() -> None:
    assert "not below the upper" in refused(f"{RC}rollout_is_threshold_lower=2.5")
    assert "without importance weights" in refused(f"{RC}rollout_is=null", f"{RC}rollout_is_threshold_lower=0.5")
    assert "rollout_token_veto_threshold" in refused(f"{RC}rollout_token_veto_threshold=1.5")


@pytest.mark.parametrize("setting", [f"{RC}rollout_rs=token", f"{RC}rollout_token_veto_threshold=0.0001",
                                     f"{RC}rollout_is=sequence"])  # fmt: skip
def test_bypass_excludes_weights_and_rejection(setting: str) -> None:
    extra = [f"{RC}rollout_rs_threshold=5"] if "rollout_rs" in setting else []
    msg = refused(f"{RC}bypass_mode=True", setting, *extra)
    assert f"{RC}bypass_mode" in msg and "bypass_mode=False" in msg


def test_gspo_needs_sequence_mean() -> None:
    msg = refused(f"{PL}loss_mode=gspo")
    assert "algorithm.loss_agg_mode=seq-mean-token-mean" in msg and "'token-mean'" in msg


@pytest.mark.parametrize("mode", ["gspo", "cispo"])
def test_dual_clip_is_ppo_only(mode: str) -> None:
    msg = refused(f"{PL}loss_mode={mode}", f"{PL}clip_ratio_c=3", "algorithm.loss_agg_mode=seq-mean-token-mean")
    assert f"{PL}clip_ratio_c" in msg and "loss_mode=ppo" in msg


def test_normaliser_shaping_and_rloo() -> None:
    assert "seq-mean-token-sum-norm" in refused("algorithm.loss_scale_factor=64")
    assert "shorter than the longest response" in refused(
        "algorithm.overlong_buffer.enable=True", "algorithm.overlong_buffer.len=24"
    )
    assert "psrl.rollout_n" in refused("algorithm.adv_estimator=rloo", "psrl.rollout_n=1")


@pytest.mark.parametrize(
    "valid",
    [
        [f"{RC}rollout_is=null", f"{RC}rollout_rs=token", f"{RC}rollout_rs_threshold=5",
         f"{RC}rollout_rs_threshold_lower=0.5"],
        [f"{RC}rollout_is=sequence", f"{RC}rollout_rs=sequence", f"{RC}rollout_rs_threshold=2",
         f"{RC}rollout_is_threshold_lower=0.5", f"{RC}rollout_token_veto_threshold=0.0001"],
        [f"{RC}rollout_is=geometric", f"{PL}loss_mode=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean"],
        [f"{PL}loss_mode=cispo", "algorithm.adv_estimator=rloo", "algorithm.loss_agg_mode=seq-mean-token-sum-norm",
         "algorithm.loss_scale_factor=32", "algorithm.overlong_buffer.enable=True", f"{PL}cispo_clip_ratio_high=4"],
        [f"{PL}clip_ratio_c=3"],
        [f"{RC}bypass_mode=True"],
    ],
)  # fmt: skip
def test_meaningful_combinations_load(valid: list[str]) -> None:
    load_config("demo", valid)


def test_defaults_keep_token_tis_and_ppo() -> None:
    config = load_config("demo")
    rc = config.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_token_veto_threshold) == (
        "token",
        2.0,
        None,
        None,
    )
    assert config.algorithm.policy_loss.loss_mode == "ppo" and config.algorithm.policy_loss.clip_ratio_c is None
    assert config.algorithm.loss_agg_mode == "token-mean" and not config.algorithm.overlong_buffer.enable
