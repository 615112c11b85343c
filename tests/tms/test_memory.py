"""SideMemory's regions, pause and resume against a recording backend (the GPU is the gpu tests' part)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from psrl.tms import ROLLOUT, TRAINER, SideMemory, managed_regions, managed_sides


class RecordingBackend:
    """Stands in for torch-memory-saver: each region holds 100 bytes while resident."""

    def __init__(self, total: int = 1000) -> None:
        self.total = total
        self.calls: list[tuple[str, str]] = []
        self.held = {"trainer.weights": 100, "trainer.optimizer": 100, "trainer.grads": 100}

    def region(self, tag: str, keeps_contents: bool) -> contextlib.AbstractContextManager[Any]:
        self.calls.append(("region", f"{tag}:{keeps_contents}"))
        return contextlib.nullcontext()

    def graph_capture(self, graph: Any, pool: Any, tag: str) -> contextlib.AbstractContextManager[Any]:
        self.calls.append(("graph", tag))
        return contextlib.nullcontext()

    def pause(self, tag: str) -> None:
        self.calls.append(("pause", tag))
        self.total += self.held[tag]

    def resume(self, tag: str) -> None:
        self.calls.append(("resume", tag))
        self.total -= self.held[tag]

    def synchronize(self) -> None:
        pass

    def free_bytes(self) -> int:
        return self.total


def test_ranges_manage_their_sides() -> None:
    assert managed_sides(None) == () and managed_sides("train") == (TRAINER,)
    assert managed_sides("all") == (TRAINER, ROLLOUT) and managed_sides("rollout") == (ROLLOUT,)
    assert managed_regions("train", ROLLOUT) == ()
    assert [r.name for r in managed_regions("all", ROLLOUT)] == ["weights", "kv_cache"]
    assert [r.name for r in managed_regions("all", ROLLOUT, enable_cuda_graph=True)][-1] == "cuda_graph"
    kept = {r.name: r.keeps_contents for r in managed_regions("all", TRAINER)}
    assert kept == {"weights": True, "optimizer": True, "grads": False}
    with pytest.raises(ValueError, match="unknown side"):
        managed_regions("all", "critic")


def test_pause_releases_in_reverse_order_and_resume_restores() -> None:
    backend = RecordingBackend()
    ticks = iter(range(100))
    memory = SideMemory(TRAINER, managed_regions("all", TRAINER), backend, clock=lambda: next(ticks) / 1000)
    with memory.region("weights"), memory.region("not_managed"):
        pass
    assert backend.calls == [("region", "trainer.weights:True")]
    paused = memory.pause()
    assert [tag for op, tag in backend.calls if op == "pause"] == [
        "trainer.grads",
        "trainer.optimizer",
        "trainer.weights",
    ]
    assert paused.changed_bytes == 300 and paused.free_bytes == 1300 and memory.is_paused
    assert set(paused.region_ms) == {"weights", "optimizer", "grads"} and paused.duration_ms > 0
    again = memory.pause()  # repeated: reported again, nothing released twice
    assert again.changed_bytes == 0 and backend.total == 1300
    resumed = memory.resume()
    assert resumed.action == "resume" and resumed.changed_bytes == 300 and not memory.is_paused


def test_unmanaged_side_allocates_resident_and_switches_nothing() -> None:
    memory = SideMemory.unmanaged(ROLLOUT)
    assert not memory.is_managed
    with memory.region("kv_cache"):
        pass
    report = memory.pause()
    assert report.duration_ms == 0 and report.changed_bytes == 0


def test_regions_need_a_backend_and_their_own_side() -> None:
    with pytest.raises(ValueError, match="need a memory backend"):
        SideMemory(TRAINER, managed_regions("all", TRAINER), None)
    with pytest.raises(ValueError, match="another side"):
        SideMemory(TRAINER, managed_regions("all", ROLLOUT), RecordingBackend())
