"""`psrl replay`: timeline summary, checker registry, agreement and what-if, on real log files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bus.codec import Encoder
from bus.eventlog import EventLogWriter
from bus.messages import Heartbeat, Metrics, Reserve
from bus.schema import Envelope, Event, Message
from psrl.cli.replay_cmd import replay as replay_cli
from psrl.replay import Checker, ReplayError, available_checkers, register_checker, replay_run
from psrl.replay.checker import CANNOT_JUDGE, CHECKERS, NotJudged

SECOND = 1_000_000_000


class LogBuilder:
    """Writes events as the logger would: stamped envelopes, encoded frames, one record each."""

    def __init__(self, run_dir: Path) -> None:
        self.writer = EventLogWriter(run_dir / "events", segment_bytes=2048)
        self.encoder = Encoder()
        self.seqs: dict[str, int] = {}
        self.wall_ns = 1_750_000_000 * SECOND

    def add(self, sender: str, message: Message, *, skip: int = 0, after_s: float = 0.01, **env: Any) -> None:
        seq = self.seqs.get(sender, 0) + 1 + skip
        self.seqs[sender] = seq
        self.wall_ns += int(after_s * SECOND)
        envelope = Envelope(message.KIND, 1, sender, 0, seq, self.wall_ns, self.wall_ns, **env)
        self.writer.append(self.encoder.encode(envelope, message))

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run with config psrl.staleness=1: the coordinator reserves buffer V+1, the trainer logs metrics."""
    (tmp_path / "config.yaml").write_text("psrl:\n  staleness: 1\n")
    log = LogBuilder(tmp_path)
    for prompt_id in range(30):
        version = prompt_id // 10
        log.add("coordinator", Reserve(prompt_id, version, buffer=version + 1, slot=prompt_id % 10))
        log.add("trainer", Metrics(prompt_id, {"loss": 1.0}), after_s=2.5 if prompt_id == 17 else 0.01)
    log.add("trainer", Heartbeat(state=2), skip=2)  # two trainer events never reached the log
    log.close()
    return tmp_path


class LatestBufferChecker(Checker):
    """Test checker: with empty buffers, Reserve takes the latest legal buffer, V + eta."""

    name = "test-latest-buffer"
    decisions = ("ledger.reserve",)

    def redecide(self, event: Event[Any]) -> int:
        return event.message.version + self.config.psrl.staleness

    def recorded(self, event: Event[Any]) -> int:
        return event.message.buffer


@pytest.fixture(autouse=True)
def latest_buffer_checker() -> Iterator[None]:
    """Registered for this module's tests only: other tests replay real runs with ``all`` checkers."""
    register_checker(LatestBufferChecker)
    yield
    del CHECKERS[LatestBufferChecker.name]


def test_timeline_counts_kinds_actors_gaps_and_quiet_periods(run_dir: Path) -> None:
    timeline = replay_run(run_dir).timeline
    assert timeline.num_events == 61
    assert timeline.events_per_kind == {"ledger.reserve": 30, "obs.metrics": 30, "actor.heartbeat": 1}
    assert timeline.actors["coordinator#0"].num_missing == 0
    assert timeline.actors["trainer#0"].num_missing == 2
    assert timeline.actors["trainer#0"].last_seq == 33
    (gap,) = timeline.quiet_gaps
    assert gap.seconds == pytest.approx(2.5)
    assert gap.after_event_id == "coordinator#0:18"
    assert timeline.span_s == pytest.approx(59 * 0.01 + 2.5, abs=1e-6)  # 60 steps between 61 events
    assert timeline.problems == []


def test_torn_tail_is_reported_in_the_summary(run_dir: Path) -> None:
    last = sorted((run_dir / "events").iterdir())[-1]
    os.truncate(last, last.stat().st_size - 5)
    timeline = replay_run(run_dir).timeline
    assert timeline.num_events == 60
    (problem,) = timeline.problems
    assert problem.segment == str(last) and "torn tail" in problem.reason


def test_checker_agrees_with_the_record_and_what_if_reports_changes(run_dir: Path) -> None:
    report = replay_run(run_dir, ["test-latest-buffer"], ["psrl.staleness=2"])
    (checked,) = report.checkers
    assert (checked.agreement.num_decisions, checked.agreement.num_agree) == (30, 30)
    assert checked.what_if is not None and checked.what_if.num_disagree == 30
    first = checked.what_if.disagreements[0]
    assert (first.event_id, first.recorded, first.recomputed) == ("coordinator#0:1", 1, 2)
    unchanged = replay_run(run_dir, ["test-latest-buffer"], ["psrl.staleness=1"]).checkers[0]
    assert unchanged.what_if is not None and unchanged.what_if.num_disagree == 0


def test_builtin_sequence_checker_finds_the_lost_events(run_dir: Path) -> None:
    (checked,) = replay_run(run_dir, ["sequence"]).checkers
    assert checked.agreement.num_decisions == 61
    assert checked.agreement.num_disagree == 1
    (lost,) = checked.agreement.disagreements
    assert (lost.event_id, lost.recorded, lost.recomputed) == ("trainer#0:33", 33, 31)


def test_cli_prints_summary_and_exits_1_on_disagreement(run_dir: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(replay_cli, [str(run_dir), "--check", "sequence"])
    assert result.exit_code == 1
    assert "ledger.reserve" in result.output and "missing 2" in result.output
    assert "checker sequence: 60 of 61 decisions agree" in result.output
    ok = runner.invoke(replay_cli, [str(run_dir), "--check", "test-latest-buffer", "--what-if", "psrl.staleness=3"])
    assert ok.exit_code == 0, ok.output
    assert "30 of 30 decisions would change" in ok.output


def test_cli_json_is_machine_readable(run_dir: Path) -> None:
    result = CliRunner().invoke(replay_cli, [str(run_dir), "--json", "--check", "all"])
    data = json.loads(result.output)
    assert data["timeline"]["num_events"] == 61
    assert data["timeline"]["num_missing"] == 2
    assert {c["name"] for c in data["checkers"]} >= {"sequence", "test-latest-buffer"}


def test_unknown_checker_and_missing_log_are_clear_errors(tmp_path: Path, run_dir: Path) -> None:
    with pytest.raises(ReplayError, match="unknown checker"):
        replay_run(run_dir, ["nope"])
    with pytest.raises(ReplayError, match="events does not exist"):
        replay_run(tmp_path / "nowhere")
    result = CliRunner().invoke(replay_cli, [str(run_dir), "--what-if", "psrl.staleness=2"])
    assert result.exit_code == 2 and "--what-if needs at least one --check" in result.output


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    saved = dict(CHECKERS)
    yield
    CHECKERS.clear()
    CHECKERS.update(saved)


def test_registration_is_validated(scratch_registry: None) -> None:
    class Nameless(Checker):
        decisions = ("gen.",)

        def redecide(self, event: Event[Any]) -> None:
            return None

    with pytest.raises(ValueError, match="needs a class attribute `name`"):
        register_checker(Nameless)

    class Clash(Nameless):
        name = "sequence"

    with pytest.raises(ValueError, match="is taken by"):
        register_checker(Clash)


def test_list_checkers_needs_no_run_dir_and_help_names_every_checker() -> None:
    names = list(available_checkers())
    listed = CliRunner().invoke(replay_cli, ["--list-checkers"])
    assert listed.exit_code == 0, listed.output
    assert [line.split()[0] for line in listed.output.splitlines()] == names
    shown = CliRunner().invoke(replay_cli, ["--help"])
    assert shown.exit_code == 0 and all(f"\n  {name} " in shown.output for name in names), shown.output
    missing = CliRunner().invoke(replay_cli, [])
    assert missing.exit_code == 2 and "Missing argument 'RUN_DIR'" in missing.output


class HalfJudgedChecker(Checker):
    """Test checker: judges even prompt groups only, and cannot say why for group 0."""

    name = "test-half-judged"
    decisions = ("ledger.reserve",)

    def redecide(self, event: Event[Any]) -> int | NotJudged | None:
        prompt_id = event.message.prompt_id
        if prompt_id == 1:
            return None
        return NotJudged("odd prompt group") if prompt_id % 2 else event.message.buffer

    def recorded(self, event: Event[Any]) -> int:
        return event.message.buffer


def test_not_judged_decisions_are_counted_by_reason(run_dir: Path, scratch_registry: None) -> None:
    register_checker(HalfJudgedChecker)
    (checked,) = replay_run(run_dir, ["test-half-judged"]).checkers
    verdicts = checked.agreement
    assert (verdicts.num_agree, verdicts.num_skipped, verdicts.num_disagree) == (15, 15, 0)
    assert verdicts.not_judged == {"odd prompt group": 14, CANNOT_JUDGE: 1}
    result = CliRunner().invoke(replay_cli, [str(run_dir), "--check", "test-half-judged"])
    assert f"15 not judged (14 odd prompt group; 1 {CANNOT_JUDGE})" in result.output, result.output
