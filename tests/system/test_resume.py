"""A run never loses work: resume far past the staleness bound, and a checkpoint when it is stopped.

Regressions: a resumed run whose checkpoint was past the staleness bound hung (the router and the
coordinator restarted their ledger and prompt stream at 0); Ctrl-C lost every step (no
checkpoint before the end); the final checkpoint had no tokenizer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import LedgerOp, TrainBatch, TrainerProgress
from launch.supervisor import EXIT_INTERRUPTED, INCARNATIONS_PER_LAUNCH, Supervisor, resume_point
from psrl.config import load_config
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from psrl.trainer.checkpoint import latest_checkpoint, read_trainer_state
from tests.system.run_checks import check_staleness_bound, read_run

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]  # two launches each

SMALL = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo_short", "psrl.staleness=1",
         "trainer.save_freq=0", "bus.handshake_timeout_s=120"]  # fmt: skip
REDUNDANT = [
    "psrl.rollout_coordination.redundant_rollout.enable=True",
    "psrl.rollout_coordination.redundant_rollout.redundant_global_batch_size=10",
    "psrl.rollout_coordination.redundant_rollout.redundant_rollout_n=5",
    "psrl.rollout_coordination.partial_rollout.enable=True",
]


def events_of(run_dir: RunDir) -> list:
    return [e.event for e in EventLogReader(run_dir.events).events()]


def log_tail(run_dir: RunDir, actor: str, lines: int = 60) -> str:
    path = run_dir.log_file(actor)
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else "(no log)"


def trained_prompts(events: list) -> list[int]:
    """Prompt ids of every buffer the trainer trained on (the coordinator may hand over a buffer past
    the last step, which the trainer skips), in training order."""
    launch = lambda e: e.envelope.incarnation // INCARNATIONS_PER_LAUNCH  # noqa: E731
    made = {(launch(e), e.message.version) for e in events if isinstance(e.message, TrainerProgress)}
    return [p for e in events if isinstance(e.message, TrainBatch) and (launch(e), e.message.buffer + 1) in made
            for p in e.message.prompt_ids]  # fmt: skip


def test_resume_far_past_the_staleness_bound_continues_ledger_and_cursor(tmp_path) -> None:
    run_dir = RunDir.create(tmp_path / "runs", "resume")
    first = load_config("demo", [*SMALL, *REDUNDANT, "trainer.total_steps=5"])
    assert Supervisor(first, run_dir).run() == 0
    point = resume_point(run_dir, first.entries_per_buffer)
    assert point.version == 5 > first.psrl.staleness + 1
    before = events_of(run_dir)
    assert point.next_prompt_id == max(trained_prompts(before)) + 1

    second = load_config("demo", [*SMALL, *REDUNDANT, "trainer.total_steps=8"])
    sup = Supervisor(second, run_dir)
    started = time.monotonic()
    assert sup.run() == 0, sup.end_reason
    assert time.monotonic() - started < 240, "the resumed run must not stall"
    events = events_of(run_dir)
    later = events[len(before) :]
    versions = [e.message.version for e in later if isinstance(e.message, TrainerProgress)]
    assert versions[:3] == [6, 7, 8]
    # a consume op's prompt_id is the buffer id
    consumed = [e.message.prompt_id for e in later if isinstance(e.message, LedgerOp) and e.message.op == "consume"]
    assert consumed[:3] == [5, 6, 7], "the router's ledger continues at the checkpoint's version"
    trained = trained_prompts(events)
    repeated = [p for p, n in Counter(trained).items() if n > 1]
    assert not repeated, f"prompts trained twice: {repeated[:5]}"
    assert min(trained_prompts(later)) >= point.next_prompt_id, "the prompt cursor continues"
    check_staleness_bound(read_run(run_dir.events), second.psrl.staleness)
    for checker in replay_run(run_dir.path, ["all"]).checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])


def test_sigterm_mid_run_checkpoints_and_the_run_resumes(tmp_path) -> None:
    run_dir = RunDir.create(tmp_path / "runs", "stopped")
    # a run that makes no step for two minutes gets the stall watch's diagnosis and stack dumps
    config = load_config("demo", [*SMALL, "trainer.total_steps=200", "run.stall_timeout_s=60"])
    progress: list[int] = []

    def stop_after_three_steps(sup: Supervisor) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(progress) < 3:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler or Ctrl-C does to the launcher

    sup = Supervisor(config, run_dir, listeners=(
        lambda e: progress.append(e.message.version) if isinstance(e.message, TrainerProgress) else None,))  # fmt: skip
    threading.Thread(target=stop_after_three_steps, args=(sup,), daemon=True).start()
    code = sup.run()
    assert code == EXIT_INTERRUPTED, sup.end_reason
    latest = latest_checkpoint(run_dir.checkpoints)
    assert latest is not None, (
        f"a stopped run keeps its progress (save_freq=0: nothing else saved it); steps seen {progress}; "
        f"the trainer's log ends:\n{log_tail(run_dir, 'trainer-0')}"
    )
    saved = read_trainer_state(latest)["version"]
    assert saved >= 3 and saved >= max(progress) - 1
    assert (latest / "policy" / "tokenizer.json").is_file()
    # the stopped launch's shards kept their snapshots; a new launch must not restore them (its
    # trainer pushes from the checkpoint, which may be older than the snapshots' version)
    assert list((run_dir.path / "ps").glob("*.committed"))

    resumed = load_config("demo", [*SMALL, f"trainer.total_steps={saved + 2}"])
    sup = Supervisor(resumed, run_dir)
    assert sup.run() == 0, sup.end_reason
    versions = [e.message.version for e in events_of(run_dir) if isinstance(e.message, TrainerProgress)]
    assert versions[-2:] == [saved + 1, saved + 2]
    trained = trained_prompts(events_of(run_dir))
    assert not [p for p, n in Counter(trained).items() if n > 1], "no prompt is trained twice"
