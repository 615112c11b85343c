"""A small scripted run whose report figures can be worked out by hand.

Two instances report every 0.5 s from t=1 to t=9: rollout-0 runs requests until t=5 (busy 4 of the
8 s work window), rollout-1 all the time. The trainer finishes steps 1-4 at t=3, 5, 7, 9, each
taking 1.0 s compute + 0.5 s push (idle 1 - 6/8 = 0.25), then step 5 at t=9.5 after the run ended
at t=9.2. Each step's batch has 8 trajectories and 100 response tokens (32 / 8 s = 4 traj/s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bus.codec import Encoder
from bus.eventlog import EventLogWriter
from bus.messages import (
    ActorStarted,
    InstanceStatus,
    Metrics,
    MigrateCommand,
    RoutingRecord,
    RunFinished,
    StalenessCertificate,
    SyncCommand,
    TrainBatch,
    TrainerProgress,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Event, Message
from psrl.config import load_config
from psrl.config.loader import to_yaml
from tests.report.events import make_event

INSTANCES = ("rollout-0", "rollout-1")
PROGRESS_TIMES = (3.0, 5.0, 7.0, 9.0, 9.5)
RUN_END_S = 9.2


class Script:
    def __init__(self) -> None:
        self.events: list[Event[Any]] = []
        self.seq = 0

    def add(self, at_s: float, message: Message, sender: str, version: int | None = None) -> None:
        self.seq += 1
        self.events.append(make_event(message, sender, at_s=at_s, seq=self.seq, model_version=version))


def scenario_events() -> list[Event[Any]]:
    script = Script()
    script.add(0.0, ActorStarted("router", 0, 1, "local"), "supervisor")
    script.add(1.0, RoutingRecord(0, "rollout-0", "request_num_balance", b""), "router")
    _instance_reports(script)
    _training(script)
    script.add(6.0, MigrateCommand("rollout-0", "rollout-1", [7, 8, 9], "kv"), "coordinator")
    script.add(RUN_END_S, RunFinished(True, "4 training steps done"), "coordinator")
    return sorted(script.events, key=lambda e: e.envelope.wall_ns)


def _instance_reports(script: Script) -> None:
    for tick in range(17):
        at_s = 1.0 + 0.5 * tick
        version = sum(1 for t in PROGRESS_TIMES if t + 0.15 <= at_s)
        for name in INSTANCES:
            running = 2 if name == "rollout-1" else (4 if at_s < 5.0 else 0)
            status = InstanceStatus(name, version, running, 0, running * 3, 100, tokens_per_s=50.0 * running)
            script.add(at_s, status, name, version)


def _training(script: Script) -> None:
    for step, done_s in enumerate(PROGRESS_TIMES, start=1):
        script.add(done_s - 1.6, TrainBatch(step, step - 1, [step], 8, 100, max(step - 3, 0)), "coordinator")
        script.add(done_s - 1.6, Metrics(step, {"reward/mean": 0.1 * step, "acc/mean": 0.05 * step}), "coordinator")
        script.add(done_s - 1.6, Metrics(step - 1, {f"staleness/count_{min(step - 1, 2)}": 8.0}), "router")
        health = {"actor/entropy": 1.5 - 0.1 * step, "actor/grad_norm": 2.0 / step, "actor/ppo_kl": 0.01 * step,
                  "response_length/mean": 10.0 + step}  # fmt: skip
        script.add(done_s - 0.5, Metrics(step, {"perf/train_seconds": 1.0, "actor/pg_loss": -0.1, **health}),
                   "trainer-0", step)  # fmt: skip
        if step % 2 == 0:
            script.add(done_s - 0.4, Metrics(step, {"val/reward/mean": 0.2 * step}), "coordinator", step)
        push = {"sync/push_s": 0.5, "sync/serialize_s": 0.1, "sync/transfer_s": 0.3, "sync/commit_s": 0.05}
        script.add(done_s, Metrics(step, push), "trainer-0", step)
        script.add(done_s, TrainerProgress(step, step, 8, 1.6), "trainer-0", step)
        script.add(done_s, _certificate(step), "trainer-0", step)
        script.add(done_s + 0.05, WeightsPublished(step, "digest", 2), "ps-0", step)
        if done_s < RUN_END_S:
            script.add(done_s + 0.1, SyncCommand(list(INSTANCES), step, True, "greedy"), "coordinator", step)
            for name, load_ms in zip(INSTANCES, (10.0, 20.0), strict=True):
                script.add(done_s + 0.15, WeightsLoaded(name, step, load_ms), name, step)


def write_run(directory: Path, events: list[Event[Any]] | None = None, *, with_config: bool = True) -> Path:
    """A run directory holding config.yaml (demo preset) and the scenario's event log."""
    (directory / "events").mkdir(parents=True, exist_ok=True)
    if with_config:
        (directory / "config.yaml").write_text(to_yaml(load_config("demo")))
    writer = EventLogWriter(directory / "events", segment_bytes=4096)
    encoder = Encoder()
    for event in scenario_events() if events is None else events:
        writer.append(encoder.encode(event.envelope, event.message))
    writer.close()
    return directory


def _certificate(version: int) -> StalenessCertificate:
    buffer, rows = version - 1, 8
    v_traj = np.asarray([max(buffer - i % 3, 0) for i in range(rows)], np.int32)
    return StalenessCertificate(
        buffer=buffer, version=version, request_ids=np.arange(rows, dtype=np.int32) + 8 * buffer, v_traj=v_traj,
        min_token_version=v_traj, max_token_version=v_traj, flags=np.asarray([i % 2 for i in range(rows)], np.int32),
        is_mean=np.linspace(0.8, 1.2, rows, dtype=np.float32), is_clipped_frac=np.zeros(rows, np.float32),
        is_threshold=2.0,
    )  # fmt: skip
