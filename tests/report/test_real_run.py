"""A real demo run (every actor a real process on the real bus) with the metrics sink as a launcher
listener, then `psrl report` on its directory."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from bus.eventlog.reader import EventLogReader
from bus.messages import Metrics
from launch.metrics_sink import MetricsSink
from launch.supervisor import EXIT_OK, Supervisor
from psrl.cli.report_cmd import report
from psrl.config import load_config
from psrl.report.build import build_report
from psrl.report.metrics_file import read_metrics_file
from psrl.report.tensorboard import read_scalars
from psrl.rundir import RunDir

pytest.importorskip("matplotlib")


@pytest.mark.slow
@pytest.mark.system
def test_demo_run_metrics_and_report(tmp_path: Path) -> None:
    config = load_config("demo", ["trainer.total_steps=3", "psrl.staleness_buffer_entries=8", "psrl.rollout_n=4"])
    run = RunDir.create(tmp_path, "demo3")
    sink = MetricsSink(run)
    code = Supervisor(config, run, listeners=(sink.on_event,)).run()
    sink.close()
    assert code == EXIT_OK

    logged = [e.event for e in EventLogReader(run.events).events() if isinstance(e.event.message, Metrics)]
    records, problems = read_metrics_file(run.metrics)
    assert problems == [] and sink.num_write_errors == 0
    # The launcher may stop listening before the logger has written the last events, and the other
    # way round: both hold nearly all metrics events.
    assert len(records) >= len(logged) - 2 and len(records) == sink.num_records
    assert {"coordinator", "router", "trainer-0"} <= {r.sender for r in records}
    rewards = read_scalars(run.tensorboard / "coordinator")["reward/mean"]
    assert {p.step for p in rewards} >= {1, 2, 3}
    assert "sync/push_s" in read_scalars(run.tensorboard / "trainer-0")

    result = build_report(run.path)
    # the demo has no held-out split and is not colocated
    assert set(result.skipped) == {"Held-out evaluation", "GPU memory switches (colocated runs)"}, result.skipped
    assert len(result.plots) == 7 and all(p.stat().st_size > 10_000 for p in result.plots.values())
    assert result.summary.num_steps == 3
    assert result.summary.busy_fraction is not None and 0 < result.summary.busy_fraction <= 1
    assert result.summary.trainer_idle_fraction is not None
    page = result.html.read_text()
    assert all(f"src='{p.name}'" in page for p in result.plots.values())

    intervals = CliRunner().invoke(report, [str(run.path), "--intervals"])  # where each step's interval went
    assert intervals.exit_code == 0, intervals.output
    lines = intervals.output.strip().splitlines()
    assert lines[-1].startswith("2 intervals: median") and lines[0].startswith("step    2")
