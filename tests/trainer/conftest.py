"""Fixtures of the trainer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .trainer_helpers import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))
