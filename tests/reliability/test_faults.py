"""Seeded fault plans, recovery read back from the log, and the hostile frames' promise."""

from __future__ import annotations

from typing import Any

import pytest

from bus.codec import Decoder
from bus.errors import DecodeError
from bus.messages import ActorExited, EnvWorkerReady, Heartbeat, Ready
from bus.schema import Envelope, Event, Message
from psrl.reliability.faults import (
    ANCHORS,
    KILL,
    MAX_ANCHOR_DELAY_S,
    PUBLISH,
    STOP,
    Fault,
    InjectedFault,
    parse_plan,
    percentile,
    plan_faults,
    recoveries,
)
from psrl.reliability.hostile import FUZZ_SENDER, HostileFrames


def test_a_plan_is_a_function_of_its_seed() -> None:
    targets = ["rollout-0", "rollout-1", "ps-0"]
    plan = plan_faults(7, targets, 50, mean_gap_s=2.0)
    assert plan == plan_faults(7, targets, 50, mean_gap_s=2.0)
    assert plan != plan_faults(8, targets, 50, mean_gap_s=2.0)
    assert {f.target for f in plan} == set(targets)
    assert {f.kind for f in plan} == {KILL, STOP}
    assert all(f.after_s >= 0 for f in plan)
    with pytest.raises(ValueError, match="target"):
        plan_faults(1, [], 3, mean_gap_s=1.0)


def _event(sender: str, incarnation: int, wall_s: float, message: Message) -> Event[Any]:
    return Event(Envelope(type(message).KIND, 1, sender, incarnation, 1, 0, int(wall_s * 1e9)), message)


def test_recovery_is_signal_to_the_next_incarnations_ready() -> None:
    events = [
        _event("rollout-0", 0, 1.0, Ready({})),
        _event("supervisor", 0, 12.5, ActorExited("rollout-0", 0, -9)),
        _event("rollout-0", 1, 19.0, Ready({})),
        _event("ps-0", 0, 30.0, Ready({})),  # an old incarnation's Ready never counts
    ]
    faults = [InjectedFault("rollout-0", KILL, 12.0, 0), InjectedFault("ps-0", STOP, 25.0, 0)]
    healed, never = recoveries(faults, events)
    assert healed.seconds == pytest.approx(7.0) and healed.detect_s == pytest.approx(0.5)
    assert never.seconds is None and never.detect_s is None


def test_an_env_worker_is_killed_or_hung_and_heals_when_its_replacement_reports_ready() -> None:
    plan = plan_faults(3, ["rollout-0", "session/env"], 40, mean_gap_s=2.0)
    assert {f.kind for f in plan if f.target == "session/env"} == {KILL, STOP}
    assert {f.kind for f in plan if f.target == "rollout-0"} == {KILL, STOP}
    events = [
        _event("session", 0, 1.0, EnvWorkerReady(0, 100)),
        _event("session", 0, 11.0, EnvWorkerReady(1, 300, replaced_pid=200, reason="env worker died")),
        _event("session", 0, 13.5, EnvWorkerReady(0, 400, replaced_pid=100, reason="env worker hung (silent 5.1 s)")),
    ]
    faults = [InjectedFault("session/env", STOP, 12.0, 0, pid=100), InjectedFault("session/env", KILL, 20.0, 0, 500)]
    healed, never = recoveries(faults, events)
    assert healed.seconds == pytest.approx(1.5) and not healed.warm
    assert never.seconds is None


def test_percentiles() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0], 0.9) == 3.0
    assert percentile([float(x) for x in range(1, 101)], 0.5) == pytest.approx(50.0, abs=1)


def test_no_hostile_frame_decodes_as_anything_but_a_stray_heartbeat() -> None:
    decoder = Decoder(max_message_bytes=4096)
    frames = HostileFrames(3, max_message_bytes=4096, oversized_every=50)
    num_dropped = 0
    for message in frames.frames(2000):
        try:
            events = decoder.decode(message)
        except DecodeError:
            num_dropped += 1
            continue
        assert all(isinstance(e.message, Heartbeat) and e.envelope.sender == FUZZ_SENDER for e in events)
    assert num_dropped > 1500


def test_anchored_faults_are_timed_against_sync_moments_and_leave_unanchored_plans_unchanged() -> None:
    targets = ["router", "coordinator", "ps-0"]
    plan = plan_faults(5, targets, 60, mean_gap_s=2.0, anchored_share=0.5)
    anchored = [f for f in plan if f.anchor]
    assert 10 < len(anchored) < 50 and {f.anchor for f in anchored} == set(ANCHORS)
    assert all(0 <= f.delay_s <= MAX_ANCHOR_DELAY_S for f in anchored)
    assert plan == plan_faults(5, targets, 60, mean_gap_s=2.0, anchored_share=0.5)
    assert not any(f.anchor for f in plan_faults(5, targets, 60, mean_gap_s=2.0))


def test_an_explicit_plan_names_targets_kinds_and_moments() -> None:
    targets = ["rollout-0", "ps-1", "router"]
    plan = parse_plan("rollout-0@4, ps-1:stop@5.5,router@publish+0.1", targets)
    assert plan == [Fault(4.0, "rollout-0", KILL), Fault(5.5, "ps-1", STOP), Fault(0.0, "router", KILL, PUBLISH, 0.1)]
    assert [f.describe() for f in plan] == ["rollout-0:kill@4s", "ps-1:stop@5.5s", "router:kill@publish+0.1s"]
    for bad in ("trainer-9@1", "router:crash@1", "router"):
        with pytest.raises(ValueError, match="TARGET"):
            parse_plan(bad, targets)
