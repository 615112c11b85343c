"""ThunderAgent's capacity view follows the instance set: a session hung on an instance that left it
(scaled down or lost) moves its pin to an instance with room instead of waiting for good."""

from __future__ import annotations

from psrl.config.coordination import ThunderAgent
from psrl.coordination.session import InstanceCapacity, SessionInfo, schedule_sessions


def test_a_session_hung_on_a_removed_instance_continues_on_one_with_room() -> None:
    settings = ThunderAgent(enable=True, continue_scope="bucketed", continue_force_pin=True)
    instances = [InstanceCapacity("rollout-0", 10_000, 0.0)]
    sessions = [
        SessionInfo("1", "rollout-0", "env", "hung", 500),
        SessionInfo("2", "rollout-3", "env", "hung", 800),  # rollout-3 was scaled down
    ]
    decision = schedule_sessions(instances, sessions, settings)
    orders = {o.session_id: (o.instance_id, o.force_pin) for o in decision.resume}
    assert orders == {"1": ("rollout-0", True), "2": ("rollout-0", True)}


def test_a_stranded_session_waits_while_no_instance_has_room() -> None:
    settings = ThunderAgent(enable=True, continue_scope="bucketed", buffer_per_session=100)
    instances = [InstanceCapacity("rollout-0", 1_000, 850.0)]  # the running session's KV, measured
    sessions = [
        SessionInfo("1", "rollout-0", "generate", "running", 850),
        SessionInfo("2", "rollout-3", "env", "hung", 800),
    ]
    decision = schedule_sessions(instances, sessions, settings)
    assert decision.resume == () and decision.hang == ()
