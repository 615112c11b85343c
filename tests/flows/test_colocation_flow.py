"""CoordinatorFlow with topology.colocate: the consume/generate cycle drives pause and resume on the control channel."""

from __future__ import annotations

from bus.messages import (
    ActorExited,
    BufferReady,
    MemoryPause,
    MemoryResume,
    MemorySwitched,
    Metrics,
    Occupy,
    TrainData,
    TrainerProgress,
)
from psrl.config import load_config
from psrl.flows.coordinator import CoordinatorFlow
from tests.flows.flow_helpers import FixedPrompts, done, published, sent

COLOCATED = [
    "psrl.staleness_buffer_entries=2",
    "psrl.rollout_n=2",
    "psrl.staleness=1",
    "actor.ppo_mini_batch_size=2",
    "topology.colocate=True",
    "topology.device=cuda",  # the config rules only; nothing here touches a GPU
    "topology.n_rollout_instances=2",
    "trainer.total_steps=3",
]
N = 2


def _coordinator(*overrides: str) -> CoordinatorFlow:
    prompts = FixedPrompts()
    return CoordinatorFlow(load_config("demo", [*COLOCATED, *overrides]), prompts, prompts)


def _switched(actor: str, side: str, action: str = "pause") -> MemorySwitched:
    return MemorySwitched(actor=actor, side=side, action=action, regions=[], duration_ms=1.0, changed_bytes=0,
                          free_bytes=0)  # fmt: skip


def _controls(effects: list) -> list[tuple[str, list[str]]]:
    pauses = [("pause", m.targets) for m in published(effects, MemoryPause)]
    return pauses + [("resume", m.targets) for m in published(effects, MemoryResume)]


def _fill_buffer(flow: CoordinatorFlow, buffer: int, now: float) -> list:
    """Both groups of ``buffer`` finish, occupy it, and the router reports it full."""
    first = buffer * 2
    for prompt_id in (first, first + 1):
        for child in range(N):
            flow.handle(done(prompt_id * N + child, N, num_tokens=8 + child, v_traj=buffer), now)
        flow.handle(Occupy(prompt_id=prompt_id, version=buffer, from_buffer=buffer, buffer=buffer, slot=0), now)
    return flow.handle(BufferReady(buffer=buffer, prompt_ids=[first, first + 1]), now)


def test_the_cycle_pauses_one_side_before_resuming_the_other() -> None:
    flow = _coordinator("psrl.tms.range=all")
    assert _controls(flow.start(0.0)) == [("pause", ["trainer-0"])]
    assert _controls(flow.handle(_switched("trainer-0", "trainer"), 0.1)) == []
    ready = _fill_buffer(flow, 0, 1.0)
    assert len(sent(ready, TrainData, to="trainer-0")) == 1  # the trainer holds it until it is resumed
    assert _controls(ready) == [("pause", ["rollout-0", "rollout-1"])]
    assert _controls(flow.handle(_switched("rollout-0", "rollout"), 1.1)) == []
    resumed = flow.handle(_switched("rollout-1", "rollout"), 1.3)
    assert _controls(resumed) == [("resume", ["trainer-0"])]
    [wait] = published(resumed, Metrics)
    assert abs(wait.values["tms/switch_to_trainer_ms"] - 300) < 1e-6
    trained = flow.handle(TrainerProgress(step=1, version=1, num_samples=4), 2.0)
    assert _controls(trained) == [("pause", ["trainer-0"])]
    assert _controls(flow.handle(_switched("trainer-0", "trainer"), 2.2)) == [("resume", ["rollout-0", "rollout-1"])]


def test_range_train_keeps_the_engines_resident() -> None:
    flow = _coordinator("psrl.tms.range=train")
    flow.start(0.0)
    flow.handle(_switched("trainer-0", "trainer"), 0.1)
    assert _controls(_fill_buffer(flow, 0, 1.0)) == [("resume", ["trainer-0"])]


def test_an_instance_that_exits_mid_switch_is_not_waited_for() -> None:
    flow = _coordinator("psrl.tms.range=all")
    flow.start(0.0)
    flow.handle(_switched("trainer-0", "trainer"), 0.1)
    _fill_buffer(flow, 0, 1.0)
    flow.handle(_switched("rollout-0", "rollout"), 1.1)
    exited = flow.handle(ActorExited(actor="rollout-1", incarnation=0, returncode=1), 1.2)
    assert _controls(exited) == [("resume", ["trainer-0"])]


def test_without_colocation_nothing_is_switched() -> None:
    prompts = FixedPrompts()
    flow = CoordinatorFlow(load_config("demo", COLOCATED[:4]), prompts, prompts)
    assert flow.switch is None and _controls(flow.start(0.0)) == []
