"""Building the CPU kernels: cached per machine, and what `engine.cpu_kernels` does without a compiler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from psrl.kernels import build
from psrl.kernels.build import KernelBuildError
from psrl.kernels.library import SOURCES, cpu_kernel_library
from tests.engine.conftest import Checkpoint, greedy, make_engine, run_to_completion


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PSRL_CACHE_DIR", str(tmp_path))
    cpu_kernel_library.cache_clear()
    yield tmp_path / "kernels"
    cpu_kernel_library.cache_clear()  # later tests load the library from the usual cache again


def test_a_build_is_cached_and_reused(fresh_cache: Path, cpu_kernels: object) -> None:
    build.load_library("psrl_cpu", SOURCES)
    [library] = fresh_cache.glob("psrl_cpu-*.so")
    built_at = library.stat().st_mtime_ns
    build.load_library("psrl_cpu", SOURCES)
    assert [library] == list(fresh_cache.glob("*")) and library.stat().st_mtime_ns == built_at


def test_a_broken_source_names_the_command_and_the_compiler_error(fresh_cache: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("int f(void) { return }\n")
    with pytest.raises(KernelBuildError, match=r"broken\.c") as info:
        build.load_library("broken", [broken])
    assert "error" in str(info.value) and not list(fresh_cache.glob("*.so"))


def test_without_a_compiler_auto_warns_and_decodes_eagerly(
    fresh_cache: Path, qwen2: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    with structlog.testing.capture_logs() as logs:
        engine = make_engine(qwen2, num_kv_blocks=32)
    assert engine.runner.decode_path == "dense" and engine.sampler.kernel is None
    [warning] = [entry for entry in logs if entry["event"] == "cpu_kernels_unavailable"]
    assert "no-such-compiler" in warning["reason"] and "gcc" in warning["fix"]
    engine.add_request("r", [3, 4, 5], greedy(max_tokens=4))
    assert len(run_to_completion(engine)[0]["r"].output_ids) == 4
    with pytest.raises(KernelBuildError, match="no-such-compiler"):
        make_engine(qwen2, num_kv_blocks=32, cpu_kernels="on")


def test_off_never_builds(fresh_cache: Path, qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=32, cpu_kernels="off")
    assert engine.runner.decode_path == "dense" and engine.sampler.kernel is None
    assert not fresh_cache.exists()


def test_loading_the_kernels_leaves_the_floating_point_mode_alone(fresh_cache: Path, cpu_kernels: object) -> None:
    # a library linked with -ffast-math switches the whole process to flush denormals when loaded
    build.load_library("psrl_cpu", SOURCES)
    smallest_normal = 2.2250738585072014e-308
    assert smallest_normal / 2 > 0.0


def test_an_unwritable_cache_is_a_build_error_that_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, qwen2: Checkpoint
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("PSRL_CACHE_DIR", str(blocker))
    cpu_kernel_library.cache_clear()
    try:
        with pytest.raises(KernelBuildError, match="PSRL_CACHE_DIR"):
            build.load_library("psrl_cpu", SOURCES)
        assert make_engine(qwen2, num_kv_blocks=16).runner.decode_path == "dense"  # auto: warned, eager
    finally:
        cpu_kernel_library.cache_clear()
