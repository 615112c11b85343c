"""With the KV offload tier on, ThunderAgent does not keep room for sessions resting at their tools.

A resting session's blocks go to the tier when a running turn needs their room and come back by a
copy, so its KV weighs 0 in the capacity view by default (``env_token_weight`` unset); without the
tier it weighs 1, as before. A weight set by hand stays, and the resolved weight is in the run's
config, so a replay decides with the same one.
"""

from __future__ import annotations

from psrl.config import load_config
from psrl.config.coordination import ThunderAgent
from psrl.config.loader import to_yaml
from psrl.coordination.session import InstanceCapacity, SessionInfo, schedule_sessions

TA = "psrl.rollout_coordination.session_strategy.thunder_agent."
TIER = ["psrl.lmcache.enable=true", "psrl.lmcache.store=host"]


def weight(overrides: list[str]) -> float | None:
    return load_config("agentic", overrides).psrl.rollout_coordination.session_strategy.thunder_agent.env_token_weight


def test_the_weight_of_resting_sessions_is_0_with_the_tier_and_1_without() -> None:
    assert weight([TA + "enable=true"]) == 1.0
    assert weight([TA + "enable=true", *TIER]) == 0.0
    assert weight([TA + "enable=true", *TIER, TA + "env_token_weight=0.5"]) == 0.5
    assert weight([TA + "enable=false", *TIER]) is None  # nothing reads it: not resolved, not refused
    # a run's config.yaml carries the weight without a tier; loaded with the scheduler off, it is no change
    assert weight([TA + "enable=false", TA + "env_token_weight=1.0"]) == 1.0


def test_the_resolved_weight_is_written_into_the_run_config() -> None:
    config = load_config("agentic", [TA + "enable=true", *TIER])
    assert "env_token_weight: 0.0" in to_yaml(config)


def test_with_weight_0_resting_sessions_are_not_hung_for_room() -> None:
    capacity = [InstanceCapacity("i0", 1_000, 900)]
    sessions = [
        SessionInfo(f"s{k}", "i0", "env" if k else "generate", "running", tokens)
        for k, tokens in enumerate((300, 400, 400))
    ]
    kept = schedule_sessions(capacity, sessions, ThunderAgent(enable=True, env_token_weight=0.0))
    assert kept.hang == ()
    weighed = schedule_sessions(capacity, sessions, ThunderAgent(enable=True, env_token_weight=1.0))
    assert weighed.hang  # 1,100 tokens and headroom against 1,000
    assert ThunderAgent().env_weight == 1.0  # unresolved (no config): the old weight
