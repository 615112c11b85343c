"""The report of a run directory written with the real event-log writer: plots, page and command."""

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus.messages import InstanceStatus, MemorySwitched, Metrics, WeightsPublished
from psrl.cli.main import main
from psrl.errors import MissingExtraError
from psrl.report import build as build_module
from psrl.report.build import build_report
from psrl.report.collect import read_timeline
from psrl.report.plots_memory import resident_spans
from tests.report.events import make_event
from tests.report.scenario import write_run

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT_FILES = {"reward.png", "health.png", "eval.png", "staleness.png", "certificates.png", "utilisation.png",
              "version_lag.png", "sync_time.png"}  # fmt: skip
MEMORY = "GPU memory switches (colocated runs)"  # drawn for colocated runs only


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_every_plot_is_written_and_linked(tmp_path: Path) -> None:
    run = write_run(tmp_path / "scripted")
    result = build_report(run)
    assert result.output == run / "report"
    assert {p.name for p in result.plots.values()} == PLOT_FILES
    assert set(result.skipped) == {MEMORY} and result.problems == []
    for path in result.plots.values():
        width, height = png_size(path)
        assert width >= 800 and height >= 300
    page = result.html.read_text()
    assert set(re.findall(r"<img src='([^']+)'", page)) == PLOT_FILES
    assert all((result.output / name).is_file() for name in re.findall(r"href='([^']+)'", page))
    assert "trainer idle fraction" in page and "25.0%" in page
    assert result.summary.num_steps == 4


def test_missing_data_is_said_not_drawn(tmp_path: Path) -> None:
    only_metrics = [make_event(Metrics(1, {"reward/mean": 0.5}), "coordinator", at_s=1.0)]
    run = write_run(tmp_path / "thin", only_metrics, with_config=False)
    result = build_report(run, tmp_path / "out")
    assert [p.name for p in result.plots.values()] == ["reward.png"]
    assert set(result.skipped) == {"Training health", "Held-out evaluation", "Staleness histogram",
                                   "Staleness certificates",
                                   "Rollout-instance utilisation", "Version lag",
                                   "Weight-sync time per phase", MEMORY}  # fmt: skip
    assert "no inst.status events" in result.skipped["Rollout-instance utilisation"]
    assert any("config.yaml missing" in p for p in result.problems)
    page = result.html.read_text()
    assert "Not drawn" in page and "config.yaml missing" in page


def test_metrics_jsonl_is_used_when_the_log_has_no_metrics(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", [])
    (run / "metrics.jsonl").write_text(
        '{"step":1,"sender":"coordinator","incarnation":0,"wall_time":5.0,"model_version":null,'
        '"values":{"reward/mean":0.25}}\nnot json\n'
    )
    result = build_report(run)
    assert "Reward and accuracy per step" in result.plots
    assert result.summary.reward_first == 0.25
    assert any("metrics.jsonl:2" in p for p in result.problems)


def test_not_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run directory"):
        build_report(tmp_path)


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules makes an import fail
    for name in ("psrl.report.plots_rollout", "psrl.report.plots_training", "psrl.report.figure"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(MissingExtraError, match=r"\.\[report\]"):
        build_module.plot_specs()


def test_command_prints_the_summary_and_writes_the_page(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "named")
    result = CliRunner().invoke(main, ["report", "named", "--root", str(tmp_path / "runs"), "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "trajectories/s trained" in result.output and "4.00" in result.output
    assert (tmp_path / "o" / "report.html").is_file()
    missing = CliRunner().invoke(main, ["report", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "no run directory" in missing.output


def many_instance_events(num_instances: int) -> list:
    events = [make_event(WeightsPublished(v, "d", 1), "ps-0", at_s=2.0 * v, seq=v) for v in range(1, 5)]
    for tick in range(100):
        at_s = 0.1 * tick
        for index in range(num_instances):
            running = (tick + 7 * index) % 20 if index % 3 else 0
            version = max(int(at_s / 2.0) - index % 2, 0)
            status = InstanceStatus(f"rollout-{index}", version, running, 0, running, 64)
            events.append(make_event(status, f"rollout-{index}", at_s=at_s, seq=tick + 10))
    return events


def test_many_instances_use_a_heatmap(tmp_path: Path) -> None:
    run = write_run(tmp_path / "wide", many_instance_events(12))
    result = build_report(run)
    assert {"Rollout-instance utilisation", "Version lag"} <= set(result.plots)
    assert len(result.summary.busy_by_instance) == 12
    assert result.summary.busy_by_instance["rollout-0"] == 0.0


def test_training_plots_leave_out_shutdown_steps_and_smooth(tmp_path: Path) -> None:
    # regression: the report plotted reward only (no KL, entropy, length, grad norm) and drew
    # steps finished after the run had ended
    from psrl.report.collect import read_timeline
    from psrl.report.inputs import ReportInputs
    from psrl.report.plots_health import counted_steps, smooth
    from psrl.report.series import metric_by_step
    from psrl.report.summary import summarize

    run = write_run(tmp_path / "scripted")
    timeline = read_timeline(run)
    inputs = ReportInputs("scripted", timeline, summarize(timeline), 2)
    raw = metric_by_step(timeline.metrics, "actor/grad_norm")
    kept = counted_steps(inputs, raw)
    assert max(s for s, _ in raw) > inputs.summary.num_steps == max(s for s, _ in kept)
    assert smooth([1.0, 1.0, 1.0]) == [1.0, 1.0, 1.0]
    assert smooth([0.0, 10.0], 0.5) == [0.0, pytest.approx(10 * 0.5 / 0.75)]
    assert smooth([4.0, 0.0], 0.0) == [4.0, 0.0]


def test_memory_switches_of_a_colocated_run_are_drawn(tmp_path: Path) -> None:
    def switched(actor: str, action: str, at_s: float, seq: int) -> object:
        side = "trainer" if actor.startswith("trainer") else "rollout"
        message = MemorySwitched(actor=actor, side=side, action=action, regions=["weights"], duration_ms=100.0,
                                 changed_bytes=2**30, free_bytes=0)  # fmt: skip
        return make_event(message, actor, at_s=at_s, seq=seq)

    events = [switched("trainer-0", "pause", 1.0, 1), switched("rollout-0", "pause", 5.0, 1),
              switched("trainer-0", "resume", 5.2, 2), switched("trainer-0", "pause", 8.0, 3),
              switched("rollout-0", "resume", 8.3, 2)]  # fmt: skip
    run = write_run(tmp_path / "colocated", events)  # type: ignore[arg-type]
    result = build_report(run)
    assert MEMORY in result.plots and png_size(result.plots[MEMORY])[0] >= 800
    timeline = read_timeline(run)
    trainer = [m for m in timeline.switches if m.actor == "trainer-0"]
    spans = [(round(a, 2), round(b, 2)) for a, b in resident_spans(trainer, timeline)]
    assert spans == [(4.2, 2.7)]  # from its resume (done) to its next pause (begun); paused at the run's start
