"""PSRL_PROFILE_DIR: an actor's loop profiled, its statistics written where pstats reads them."""

from __future__ import annotations

import pstats
from pathlib import Path

import pytest

from actors.__main__ import _run


def busy_loop() -> int:
    return sum(i * i for i in range(10_000)) % 7


def test_the_loop_is_profiled_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSRL_PROFILE_DIR", str(tmp_path / "prof"))
    assert _run(busy_loop, "rollout-0") == busy_loop()
    stats = pstats.Stats(str(tmp_path / "prof" / "rollout-0.prof"))
    assert any(name == "busy_loop" for _, _, name in stats.stats)  # type: ignore[attr-defined]


def test_nothing_is_written_otherwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PSRL_PROFILE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert _run(busy_loop, "router") == busy_loop()
    assert list(tmp_path.iterdir()) == []
