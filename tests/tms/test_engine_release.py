"""The embedded engine's release and restore on the CPU: running sequences are preempted, the prefix
cache is forgotten, nothing steps while released, and generation continues exactly (fp32).

torch-memory-saver needs libcuda: at this test's edge the backend only records the switches (the GPU
tests release real memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from psrl.engine import Engine, EngineArgs
from psrl.tms import ROLLOUT, SideMemory, managed_regions
from tests.engine.conftest import Checkpoint, greedy, make_checkpoint, run_to_completion
from tests.tms.test_memory import RecordingBackend


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return make_checkpoint("qwen2_tied", tmp_path_factory.mktemp("release"))


def _engine(checkpoint: Checkpoint, backend: RecordingBackend) -> Engine:
    args = EngineArgs(model_path=checkpoint.path, dtype="float32", device="cpu", block_size=4)  # type: ignore[arg-type]
    backend.held.update({"rollout.weights": 10, "rollout.kv_cache": 20})
    return Engine(args, memory=SideMemory(ROLLOUT, managed_regions("all", ROLLOUT), backend))


PROMPTS = [[3, 5, 7, 11, 13], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3]]


def test_release_mid_generation_preempts_and_continues_exactly(checkpoint: Checkpoint) -> None:
    backend = RecordingBackend()
    engine = _engine(checkpoint, backend)
    assert ("region", "rollout.weights:True") in backend.calls and ("region", "rollout.kv_cache:False") in backend.calls
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"plain-{index}", prompt, greedy(24))
    expected, _ = run_to_completion(engine)
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"again-{index}", prompt, greedy(24))
    for _ in range(6):
        assert not engine.step().finished
    assert engine.scheduler.running and engine.block_manager.num_used_blocks > 0
    report = engine.release_memory()
    assert report.changed_bytes == 30 and engine.block_manager.num_used_blocks == 0
    assert not engine.scheduler.running and engine.status().num_waiting == len(PROMPTS)
    assert engine.step().outputs == [] and engine.block_manager.num_used_blocks == 0  # nothing runs released
    engine.restore_memory()
    results, _ = run_to_completion(engine)
    for index in range(len(PROMPTS)):
        assert results[f"again-{index}"].output_ids == expected[f"plain-{index}"].output_ids


def test_release_forgets_the_prefix_cache(checkpoint: Checkpoint) -> None:
    engine = _engine(checkpoint, RecordingBackend())
    engine.add_request("first", PROMPTS[2] * 3, greedy(4))
    run_to_completion(engine)
    epoch = engine.block_manager.cache_epoch
    engine.release_memory()
    engine.restore_memory()
    assert engine.block_manager.cache_epoch == epoch + 1  # KV contents were not kept: no prefix may hit them
    engine.add_request("second", PROMPTS[2] * 3, greedy(4))
    run_to_completion(engine)
    assert engine.block_manager.stats.num_hit_tokens == 0


def test_unmanaged_engine_releases_nothing(checkpoint: Checkpoint, tmp_path: Path) -> None:
    args = EngineArgs(model_path=checkpoint.path, dtype="float32", device="cpu", block_size=4)  # type: ignore[arg-type]
    engine = Engine(args)
    assert engine.release_memory().changed_bytes == 0
