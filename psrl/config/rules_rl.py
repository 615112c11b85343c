"""Cross-field rules of the RL algorithm: rollout correction, policy loss, normalisation, reward shaping.

Each rule yields the problems it finds (field, value, why, fix), like those of `psrl.config.rules`,
which runs them with the others before anything is launched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from psrl.config.root import Config
from psrl.errors import ConfigProblem

RC = "algorithm.rollout_correction."
PL = "algorithm.policy_loss."
ENGINE = "psrl.log_prob.enable_rollout_engine_log_prob"


def _problem(paths: tuple[str, ...], value: object, message: str, fix: str) -> ConfigProblem:
    return ConfigProblem(paths, repr(value), message, fix)


def correction_settings(c: Config) -> dict[str, object]:
    """The correction fields that are switched on, by name (empty = no rollout correction)."""
    rc = c.algorithm.rollout_correction
    values = {
        "rollout_is": rc.rollout_is,
        "rollout_rs": rc.rollout_rs,
        "rollout_token_veto_threshold": rc.rollout_token_veto_threshold,
        "bypass_mode": rc.bypass_mode or None,
    }
    return {name: value for name, value in values.items() if value is not None}


def correction_needs_engine_logprobs(c: Config) -> Iterator[ConfigProblem]:
    """Every correction compares the trainer's log-probs with the engine's, so the engine must send them."""
    if c.psrl.log_prob.enable_rollout_engine_log_prob:
        return
    for name, value in correction_settings(c).items():
        yield _problem(
            (RC + name, ENGINE), value,
            f"{name} compares the trainer's log-probs with the rollout engine's, which are switched off",
            f"set {ENGINE}=True, or {RC}{name}={'False' if name == 'bypass_mode' else 'null'}",
        )  # fmt: skip


def rejection_band(c: Config) -> Iterator[ConfigProblem]:
    """rollout_rs needs an upper bound, the bounds need a mode, and the band must hold ratio 1."""
    rc = c.algorithm.rollout_correction
    if rc.rollout_rs is None:
        for name in ("rollout_rs_threshold", "rollout_rs_threshold_lower"):
            if getattr(rc, name) is not None:
                yield _problem((RC + name, RC + "rollout_rs"), getattr(rc, name), "a rejection bound without rejection",
                               f"set {RC}rollout_rs (token, sequence or geometric) or remove {RC}{name}")  # fmt: skip
        return
    if rc.rollout_rs_threshold is None:
        yield _problem((RC + "rollout_rs", RC + "rollout_rs_threshold"), rc.rollout_rs,
                       "rejection needs the upper bound of its band",
                       f"set {RC}rollout_rs_threshold (e.g. 5 for token, 2 for sequence or geometric)")  # fmt: skip
        return
    lower = rc.rollout_rs_threshold_lower or 1.0 / rc.rollout_rs_threshold
    if not lower < 1.0 < rc.rollout_rs_threshold:
        yield _problem((RC + "rollout_rs_threshold", RC + "rollout_rs_threshold_lower"),
                       (lower, rc.rollout_rs_threshold),
                       "the accepted band must contain ratio 1, or tokens the two policies agree on are rejected",
                       "use rollout_rs_threshold > 1 and rollout_rs_threshold_lower < 1 (e.g. 5 and 0.5)")  # fmt: skip


def truncation_bounds(c: Config) -> Iterator[ConfigProblem]:
    rc = c.algorithm.rollout_correction
    lower = rc.rollout_is_threshold_lower
    if lower is not None and rc.rollout_is is None:
        yield _problem((RC + "rollout_is_threshold_lower", RC + "rollout_is"), lower,
                       "a lower truncation bound without importance weights",
                       f"set {RC}rollout_is (token, sequence or geometric) or remove the bound")  # fmt: skip
    elif lower is not None and lower >= rc.rollout_is_threshold:
        yield _problem((RC + "rollout_is_threshold_lower", RC + "rollout_is_threshold"),
                       (lower, rc.rollout_is_threshold), "the lower truncation bound is not below the upper one",
                       "use rollout_is_threshold_lower < 1 < rollout_is_threshold (e.g. 0.5 and 2)")  # fmt: skip
    veto = rc.rollout_token_veto_threshold
    if veto is not None and veto >= 1.0:
        yield _problem((RC + "rollout_token_veto_threshold",), veto,
                       "the veto threshold is a ratio far below 1; at 1 or above it vetoes on-policy tokens",
                       f"set {RC}rollout_token_veto_threshold well below 1 (e.g. 1e-4)")  # fmt: skip


def bypass_excludes_weights(c: Config) -> Iterator[ConfigProblem]:
    """In bypass mode the old policy is the rollout policy, so every ratio to it is 1: nothing to weigh or reject."""
    rc = c.algorithm.rollout_correction
    if not rc.bypass_mode:
        return
    for name in ("rollout_rs", "rollout_token_veto_threshold"):
        if getattr(rc, name) is not None:
            yield _problem((RC + "bypass_mode", RC + name), getattr(rc, name),
                           "bypass mode uses the engine's log-probs as the old policy, so the ratio it "
                           "rejects on is 1 everywhere", f"set {RC}bypass_mode=False or {RC}{name}=null")  # fmt: skip
    if rc.rollout_is in ("sequence", "geometric"):
        yield _problem((RC + "bypass_mode", RC + "rollout_is"), rc.rollout_is,
                       "bypass mode applies no separate importance weight (the PPO ratio is to pi_rollout)",
                       f"set {RC}bypass_mode=False or {RC}rollout_is=null")  # fmt: skip


def policy_loss_modes(c: Config) -> Iterator[ConfigProblem]:
    a = c.algorithm
    mode = a.policy_loss.loss_mode
    if mode == "gspo" and a.loss_agg_mode != "seq-mean-token-mean":
        yield _problem((PL + "loss_mode", "algorithm.loss_agg_mode"), a.loss_agg_mode,
                       "GSPO's objective is a mean over sequences of a per-sequence ratio",
                       "set algorithm.loss_agg_mode=seq-mean-token-mean")  # fmt: skip
    if mode != "ppo" and a.policy_loss.clip_ratio_c is not None:
        yield _problem((PL + "clip_ratio_c", PL + "loss_mode"), mode,
                       "dual clip bounds the PPO surrogate of a negative advantage; it is not part of " + mode,
                       f"set {PL}loss_mode=ppo or remove {PL}clip_ratio_c")  # fmt: skip


def normaliser_and_shaping(c: Config) -> Iterator[ConfigProblem]:
    a = c.algorithm
    if a.loss_scale_factor is not None and a.loss_agg_mode != "seq-mean-token-sum-norm":
        yield _problem(("algorithm.loss_scale_factor", "algorithm.loss_agg_mode"), a.loss_agg_mode,
                       "loss_scale_factor is the constant of seq-mean-token-sum-norm only",
                       "set algorithm.loss_agg_mode=seq-mean-token-sum-norm or remove loss_scale_factor")  # fmt: skip
    ob = a.overlong_buffer
    if ob.enable and ob.len >= c.task.max_response_length:
        yield _problem(
            ("algorithm.overlong_buffer.len", "task.max_response_length"),
            (ob.len, c.task.max_response_length),
            "the overlong buffer must be shorter than the longest response",
            "set algorithm.overlong_buffer.len below task.max_response_length (DAPO: a quarter of it)",
        )
    if a.adv_estimator == "rloo" and c.psrl.rollout_n < 2:
        yield _problem(("algorithm.adv_estimator", "psrl.rollout_n"), c.psrl.rollout_n,
                       "RLOO's baseline is the mean of the group's other rewards; a group of one has none",
                       "set psrl.rollout_n to 2 or more (e.g. 8)")  # fmt: skip


RL_RULES: tuple[Callable[[Config], Iterator[ConfigProblem]], ...] = (
    correction_needs_engine_logprobs,
    rejection_band,
    truncation_bounds,
    bypass_excludes_weights,
    policy_loss_modes,
    normaliser_and_shaping,
)
