"""The Python API and the optional W&B sink (offline: no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import psrl
from bus.messages import Metrics
from bus.schema import Envelope, Event
from launch.api import RunResult
from psrl.config import load_config
from psrl.errors import ConfigError
from psrl.rundir import RunDir


def test_run_refuses_a_bad_config_before_starting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown task"):
        psrl.run("demo", ["task.name=gsm8k"], root=tmp_path)
    with pytest.raises(ConfigError, match="no such directory"):
        psrl.run(load_config("demo"), ["model.path=/nonexistent"], root=tmp_path)
    assert not any(tmp_path.iterdir())


def test_config_objects_take_overrides_on_top() -> None:
    base = load_config("demo", ["psrl.staleness=1"])
    merged = load_config(None, ["trainer.total_steps=3"], base=base)
    assert merged.psrl.staleness == 1 and merged.trainer.total_steps == 3 and merged.task.name == "demo_short"


def test_run_result_reads_the_metrics(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "values": {"reward/mean": 0.5}}\n')
    result = RunResult(0, "done", tmp_path)
    assert result.ok and result.metrics()[0]["values"]["reward/mean"] == 0.5


def test_run_result_steps_are_the_training_metrics_only(tmp_path: Path) -> None:
    # regression: the README's example printed the last record, a weight sync's timings
    records = [
        {"step": 1, "sender": "coordinator", "values": {"reward/mean": 0.5, "acc/mean": 0.25}},
        {"step": 1, "sender": "trainer-0", "values": {"sync/push_s": 0.1}},
        {"step": 2, "sender": "coordinator", "values": {"tms/switch_to_rollout_ms": 3.0}},
        {"step": 3, "sender": "coordinator", "values": {"reward/mean": 0.75}},  # handed over, never trained
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert RunResult(0, "done", tmp_path).steps() == [{"step": 1, "reward/mean": 0.5, "acc/mean": 0.25}]


def _metrics_event(step: int, sender: str, values: dict[str, float]) -> Event:
    envelope = Envelope("obs.metrics", 1, sender, 0, step, 0, 1_700_000_000_000_000_000 + step, model_version=step)
    return Event(envelope, Metrics(step, values))


def test_wandb_offline_writes_the_run_under_the_run_directory(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("wandb")
    from launch.wandb_sink import WandbSink, wandb_run_id

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = RunDir.create(tmp_path, "run")
    config = load_config("demo", ["logging.wandb.enable=True", "logging.wandb.mode=offline"])
    sink = WandbSink(config, run_dir)
    for step in (1, 2, 3):
        sink.on_event(_metrics_event(step, "coordinator", {"reward/mean": float(np.float32(step / 10))}))
        sink.on_event(_metrics_event(step, "trainer-0", {"actor/grad_norm": 1.0 / step}))
    sink.close()
    assert sink.num_logged == 6
    offline = list((run_dir.path / "wandb").glob(f"offline-run-*-{wandb_run_id(run_dir)}"))
    assert offline, os.listdir(run_dir.path / "wandb")
    assert list(offline[0].glob("*.wandb")), "the offline run holds its records"
    sink.on_event(_metrics_event(4, "coordinator", {"reward/mean": 0.4}))  # after close: ignored
    assert sink.num_logged == 6
