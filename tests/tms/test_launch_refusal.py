"""Colocation from the command line and the launcher: refused without CUDA before anything starts, and
the preload library named for trainer and rollout processes when captured graphs are released."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from click.testing import CliRunner

from launch.placement import memory_saver_preload
from psrl.cli.main import main
from psrl.config import load_config

COLOCATED = ["topology.colocate=True", "topology.device=cuda", "psrl.tms.range=all"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_config_show_refuses_any_range_without_cuda() -> None:
    result = CliRunner().invoke(main, ["config", "show", *COLOCATED])
    assert result.exit_code != 0
    assert "psrl.tms.range" in result.output and "no CUDA device" in result.output


@pytest.mark.skipif(importlib.util.find_spec("torch_memory_saver") is None, reason="needs the gpu extra")
def test_only_trainer_and_rollout_preload_and_only_for_graphs() -> None:
    plain = load_config(None, COLOCATED)
    assert memory_saver_preload("trainer", plain) is None
    graphs = load_config(None, [*COLOCATED, "psrl.tms.enable_cuda_graph=True"])
    assert memory_saver_preload("router", graphs) is None
    library = memory_saver_preload("rollout", graphs)
    assert library is not None and "torch_memory_saver_hook_mode_preload" in library
