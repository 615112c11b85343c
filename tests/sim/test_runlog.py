"""Reading a real run back: measured throughput and the trainer and pull models, from a written event log."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.codec import Encoder
from bus.eventlog import EventLogWriter
from bus.messages import RoutingRecord, TrainBatch, TrainerProgress, WeightsLoaded, WeightsPublished
from bus.schema import Envelope, Message
from psrl.config import load_config, to_yaml
from psrl.errors import ConfigError
from psrl.sim.runlog import read_run
from psrl.sim.stats import TrainedStep, steady_throughput
from psrl.sim.validate import breakdown

SECOND = 1_000_000_000


class Log:
    def __init__(self, run_dir: Path) -> None:
        self.writer = EventLogWriter(run_dir / "events")
        self.encoder = Encoder()
        self.seq = 0

    def add(self, sender: str, at_s: float, message: Message) -> None:
        self.seq += 1
        ns = int(at_s * SECOND) + 5 * SECOND
        self.writer.append(self.encoder.encode(Envelope(message.KIND, 1, sender, 0, self.seq, ns, ns), message))


def write_run(run_dir: Path, *, total_steps: int = 4) -> None:
    """Steps of 32 trajectories: train_s = 0.2 + 0.0005 x tokens, each step 1 s after the last."""
    config = load_config("demo", [f"trainer.total_steps={total_steps}", "task.response_lengths=long_tail"])
    (run_dir / "config.yaml").write_text(to_yaml(config))
    log = Log(run_dir)
    log.add("ps-0", 0.0, WeightsPublished(0, "digest", 2))  # the first event: time 0
    log.add("router", 0.05, RoutingRecord(0, "rollout-0", "request_num_balance", b""))  # the first routed request
    for step in range(1, total_steps + 2):  # one step more than the run's: trained after it ended
        tokens = 1000 + 100 * step
        log.add("coordinator", step - 0.9, TrainBatch(step, step - 1, list(range(8)), 32, tokens, 0))
        log.add("trainer-0", float(step), TrainerProgress(step, step, 32, 0.2 + 0.0005 * tokens))
        log.add("ps-0", step + 0.02, WeightsPublished(step, "digest", 2))
        log.add("rollout-0", step + 0.1, WeightsLoaded("rollout-0", step, 10.0 * step))
    log.writer.close()


def test_measured_throughput_and_models(tmp_path: Path) -> None:
    write_run(tmp_path)
    log = read_run(tmp_path)
    assert [s.step for s in log.steps] == [1, 2, 3, 4, 5]
    assert log.steps[0].end_s == pytest.approx(1.0)
    per_s, tokens_per_s = log.throughput()
    assert per_s == pytest.approx(3 * 32 / 3.0)  # steps 2..4 over the 3 s after step 1; step 5 is after the end
    assert tokens_per_s == pytest.approx((1200 + 1300 + 1400) / 3.0)
    assert log.first_dispatch_s == pytest.approx(0.05)
    assert log.window_throughput() == pytest.approx(4 * 32 / (4.0 - 0.05))  # steps 1..4 from the first routing
    trainer = log.trainer_model()
    assert trainer.step_s == pytest.approx(0.2) and trainer.token_s == pytest.approx(0.0005)
    assert trainer.publish_s == pytest.approx(0.02)
    assert sorted(log.pull_model().samples_s) == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    assert breakdown(log.steps, 4).train_s == pytest.approx(0.2 + 0.0005 * 1300)
    assert breakdown(log.steps, 4).wait_s == pytest.approx(1.0 - (0.2 + 0.0005 * 1300))


def test_not_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run directory"):
        read_run(tmp_path)


def test_steady_throughput_needs_two_steps() -> None:
    assert steady_throughput([TrainedStep(1, 1.0, 32, 100, 0.5)], 5) == (0.0, 0.0)
    steps = [TrainedStep(1, 1.0, 32, 100, 0.5), TrainedStep(2, 3.0, 32, 200, 0.5)]
    assert steady_throughput(steps, 5) == (16.0, 100.0)
