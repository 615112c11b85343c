import json
import math
from pathlib import Path

from bus.messages import ActorState, Heartbeat, Metrics, TrainerProgress
from launch.metrics_sink import MetricsSink, tensorboard_run_name
from psrl.report.metrics_file import MetricsRecord, read_metrics_file
from psrl.report.tensorboard import read_scalars
from psrl.rundir import RunDir
from tests.report.events import T0_NS, make_event


def feed_run(sink: MetricsSink) -> None:
    sink.on_event(make_event(Heartbeat(ActorState.READY), "trainer-0/hb"))
    for step in (1, 2):
        sink.on_event(make_event(Metrics(step, {"reward/mean": step / 4}), "coordinator", at_s=step, seq=step))
        sink.on_event(make_event(Metrics(step, {"actor/pg_loss": -step, "nan": math.nan}), "trainer-0",
                                 at_s=step + 0.5, seq=step, model_version=step))  # fmt: skip
        sink.on_event(make_event(TrainerProgress(step, step, 32), "trainer-0", at_s=step + 0.6))


def test_every_metrics_event_lands_in_jsonl_and_tensorboard(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r")
    sink = MetricsSink(run)
    feed_run(sink)
    sink.close()
    sink.close()
    assert sink.num_records == 4
    lines = run.metrics.read_text().splitlines()
    assert len(lines) == 4
    first = json.loads(lines[0])
    assert first == {"step": 1, "sender": "coordinator", "incarnation": 0, "wall_time": T0_NS / 1e9 + 1,
                     "model_version": None, "values": {"reward/mean": 0.25}}  # fmt: skip
    assert json.loads(lines[1])["values"]["nan"] is None
    records, problems = read_metrics_file(run.metrics)
    assert problems == []
    assert records[3].model_version == 2 and math.isnan(records[3].values["nan"])
    assert sorted(p.name for p in run.tensorboard.iterdir()) == ["coordinator", "trainer-0"]
    trainer = read_scalars(run.tensorboard / "trainer-0")
    assert [(p.step, p.value) for p in trainer["actor/pg_loss"]] == [(1, -1.0), (2, -2.0)]
    assert trainer["actor/pg_loss"][0].wall_time == T0_NS / 1e9 + 1.5


def test_resume_appends(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r")
    for _ in range(2):
        sink = MetricsSink(run)
        feed_run(sink)
        sink.close()
    assert len(run.metrics.read_text().splitlines()) == 8
    assert len(read_scalars(run.tensorboard / "coordinator")["reward/mean"]) == 4


def test_events_after_close_are_not_written(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r")
    sink = MetricsSink(run)
    sink.close()
    sink.on_event(make_event(Metrics(1, {"x": 1.0}), "coordinator"))
    assert sink.num_records == 0
    assert run.metrics.read_text() == ""


def test_write_failure_is_counted_and_the_next_sender_still_written(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r")
    (run.tensorboard / "coordinator").write_text("not a directory")
    sink = MetricsSink(run)
    sink.on_event(make_event(Metrics(1, {"x": 1.0}), "coordinator"))
    sink.on_event(make_event(Metrics(1, {"y": 2.0}), "trainer-0"))
    sink.close()
    assert sink.num_write_errors == 1
    assert sink.num_records == 1
    assert "y" in read_scalars(run.tensorboard / "trainer-0")


def test_bad_lines_in_metrics_file_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    good = MetricsRecord(3, "coordinator", 0, 1.0, 3, {"a": 1.0}).to_json_line()
    path.write_text(good + "{not json\n" + '{"step": "x", "values": {}}\n' + "\n" + "[1]\n" + good)
    records, problems = read_metrics_file(path)
    assert [r.step for r in records] == [3, 3]
    assert len(problems) == 3
    assert ":2:" in problems[0] and "'step'" in problems[1]


def test_run_names() -> None:
    assert tensorboard_run_name("trainer-0") == "trainer-0"
    assert tensorboard_run_name("router/hb") == "router_hb"
    assert tensorboard_run_name("..") == "unnamed"
