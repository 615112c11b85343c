"""A whole colocated run in process on the CPU: the coordinator's cycle pauses and resumes the real
engines and trainer core, which never run while released and are never resident together.

torch-memory-saver needs libcuda, so at this test's edge each actor's memory backend is a guard
that records switches and enforces the invariants (the GPU tests run the real backend)."""

from __future__ import annotations

import contextlib
from typing import Any

from psrl.config import Config, load_config
from psrl.flows.driver import InProcessRun
from psrl.tms import ROLLOUT, TRAINER

SMALL = ["psrl.staleness_buffer_entries=4", "psrl.rollout_n=4", "actor.ppo_mini_batch_size=4"]


class Residency:
    """Which actors hold their memory; a resume while the other side is resident fails the run."""

    def __init__(self, *, exclusive: bool = True) -> None:
        self.exclusive = exclusive  # both sides managed: never resident together
        self.paused: set[str] = set()
        self.actors: dict[str, str] = {}
        self.log: list[tuple[str, str]] = []

    def resident(self, side: str) -> list[str]:
        return [a for a, s in self.actors.items() if s == side and a not in self.paused]


class GuardBackend:
    def __init__(self, residency: Residency, actor: str) -> None:
        self.residency, self.actor = residency, actor
        self.side = TRAINER if actor.startswith("trainer") else ROLLOUT
        residency.actors[actor] = self.side

    def region(self, tag: str, keeps_contents: bool) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def graph_capture(self, graph: Any, pool: Any, tag: str) -> contextlib.AbstractContextManager[Any]:
        raise AssertionError("no CUDA graphs on the CPU")

    def pause(self, tag: str) -> None:
        if tag.endswith(".weights"):  # the last region a pause releases
            self.residency.paused.add(self.actor)
            self.residency.log.append(("pause", self.actor))

    def resume(self, tag: str) -> None:
        if tag.endswith(".weights"):  # the first region a resume re-acquires
            other = ROLLOUT if self.side == TRAINER else TRAINER
            is_clash = self.residency.exclusive and self.residency.resident(other)
            assert not is_clash, f"{self.actor} resumed while {other} is resident"
            self.residency.paused.discard(self.actor)
            self.residency.log.append(("resume", self.actor))

    def synchronize(self) -> None:
        pass

    def free_bytes(self) -> int:
        return 0


def colocated_on_cpu(*overrides: str) -> Config:
    config = load_config("demo", ["topology.colocate=True", "topology.device=cuda", *SMALL, *overrides])
    # the rules demand CUDA for colocation (the preflight check refuses it without a device); the run goes to the CPU
    return config.model_copy(update={"topology": config.topology.model_copy(update={"device": "cpu"})})


def test_colocated_run_alternates_and_trains_every_step() -> None:
    residency = Residency()
    config = colocated_on_cpu("psrl.tms.range=all", "trainer.total_steps=3", "psrl.staleness=1")
    run = InProcessRun(config, memory_backend=lambda actor: GuardBackend(residency, actor))
    record = run.run()
    assert record.finished is not None and record.finished.success
    assert [p.version for p in record.progress] == [1, 2, 3]
    assert residency.log[0] == ("pause", "trainer-0")
    trainer_turns = [entry for entry in residency.log if entry == ("resume", "trainer-0")]
    assert len(trainer_turns) == 3  # one turn per training step
    waits = [m.values for m in record.metrics if any(k.startswith("tms/switch_to_") for k in m.values)]
    assert len(waits) >= 6  # the start, then to the trainer and back for each step but the last
    assert max(i.engine.weight_version for i in run.instances) >= 2  # rollout resumed with trained weights


def test_range_train_pauses_only_the_trainer() -> None:
    residency = Residency(exclusive=False)  # the engines stay resident under range=train
    config = colocated_on_cpu("psrl.tms.range=train", "trainer.total_steps=2")
    record = InProcessRun(config, memory_backend=lambda actor: GuardBackend(residency, actor)).run()
    assert record.finished is not None and record.finished.success
    assert {actor for _, actor in residency.log} == {"trainer-0"}
