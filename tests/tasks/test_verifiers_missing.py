"""Without the verifiers extra psrl still imports, and a configured verifiers task is refused before
launch with the install command (the main venv has no verifiers: this runs in the fast suite)."""

from __future__ import annotations

import importlib.util

import pytest

from psrl.config import load_config
from psrl.errors import ConfigError
from psrl.preflight import checked

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="verifiers is installed")


def test_a_verifiers_task_without_the_extra_names_it_before_launch() -> None:
    config = load_config("demo", ["task.name=verifiers:gsm8k", "task.kwargs={num_train_examples: 8}"])
    with pytest.raises(ConfigError) as refused:
        checked(config)
    [problem] = [p for p in refused.value.problems if p.paths == ("task.name",)]
    assert "the verifiers extra" in problem.message and "make install-verifiers" in problem.fix


def test_task_kwargs_are_taken_by_verifiers_tasks_only() -> None:
    load_config("demo", ["task.name=verifiers:gsm8k", "task.kwargs={num_train_examples: 8}"])  # accepted
    with pytest.raises(ConfigError, match="verifiers:<env>"):
        load_config("demo", ["task.name=demo", "task.kwargs={num_train_examples: 8}"])
