"""The supervisor with real actor processes that misbehave on cue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from bus.messages import ActorDead, ActorExited, ActorRestarted, ActorStarted, Ready, RunFinished
from tests.system.launch_helpers import FAKE, Background, logged_events, make_supervisor

pytestmark = pytest.mark.system


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_run_finishes_in_order_when_the_coordinator_says_so(tmp_path) -> None:
    sup = make_supervisor(tmp_path, {"coordinator": {"finish_after_s": 1.5}})
    code = sup.run()
    assert code == 0, sup.end_reason
    events = logged_events(sup.run_dir)
    started = {e.message.actor for e in events if isinstance(e.message, ActorStarted)}
    ready = {e.envelope.sender for e in events if isinstance(e.message, Ready)}
    assert started == ready == {s.name for s in sup.specs}
    assert any(isinstance(e.message, RunFinished) for e in events)
    assert all(p.poll() is not None for p in sup.processes.values())
    assert sup.run_dir.read_state()["status"] == "finished"


def test_sigkill_is_detected_and_the_instance_restarted(tmp_path) -> None:
    sup = make_supervisor(tmp_path)
    bg = Background(sup).start()
    bg.wait_ready()
    tap = subprocess.Popen([sys.executable, "-m", "psrl.cli.main", "tap", str(sup.run_dir.path), "--kind", "sup.",
                            "--json", "--duration", "20"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(2.0)  # the tap subscribes
    victim = sup.processes["rollout-0"]
    killed_at = time.time_ns()
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while sup.processes["rollout-0"].incarnation == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    bg.wait_ready()
    tap.terminate()
    tapped, _ = tap.communicate(timeout=30)
    sup._end(0, "test done")
    assert bg.join() == 0
    assert '"sup.restarted"' in tapped and '"rollout-0"' in tapped
    events = logged_events(sup.run_dir)
    exited = [e for e in events if isinstance(e.message, ActorExited) and e.message.actor == "rollout-0"]
    restarted = [e.message for e in events if isinstance(e.message, ActorRestarted)]
    assert exited and exited[0].message.returncode == -signal.SIGKILL
    detection_s = (exited[0].envelope.wall_ns - killed_at) / 1e9
    assert detection_s < 2.0, f"death seen after {detection_s:.2f} s"
    assert [(r.actor, r.old_incarnation, r.new_incarnation) for r in restarted] == [("rollout-0", 0, 1)]
    assert any(
        isinstance(e.message, Ready) and e.envelope.sender == "rollout-0" and e.envelope.incarnation == 1
        for e in events
    )


def test_a_lost_coordinator_and_router_are_restarted_and_a_budget_spent_ends_the_run(tmp_path) -> None:
    sup = make_supervisor(tmp_path)
    sup.policy.max_restarts = 1
    bg = Background(sup).start()
    bg.wait_ready()
    for name in ("router", "coordinator"):
        os.kill(sup.processes[name].pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(sup.processes[n].incarnation == 1 for n in ("router", "coordinator")):
        time.sleep(0.1)
    bg.wait_ready()
    os.kill(sup.processes["coordinator"].pid, signal.SIGKILL)  # a second death within the window: no budget left
    assert bg.join() == 1
    assert "coordinator died" in (sup.end_reason or "") and "1 times within" in (sup.end_reason or "")
    restarted = {e.message.actor for e in logged_events(sup.run_dir) if isinstance(e.message, ActorRestarted)}
    assert restarted == {"router", "coordinator"}


def test_an_actor_failing_at_start_is_named_with_its_reason(tmp_path) -> None:
    sup = make_supervisor(tmp_path, {"rollout-1": {"fail_at_start": True}})
    assert sup.run() == 1
    assert "rollout-1 exited while starting" in (sup.end_reason or "")
    assert "told to fail at start" in (sup.end_reason or "")
    dead = [e for e in logged_events(sup.run_dir) if isinstance(e.message, ActorDead)]
    assert dead and dead[0].envelope.sender == "rollout-1"


def test_slow_start_and_an_actor_ignoring_sigterm_still_stop_in_time(tmp_path) -> None:
    sup = make_supervisor(
        tmp_path,
        {"trainer-0": {"ignore_sigterm": True}, "ps-0": {"slow_start_s": 2}, "coordinator": {"finish_after_s": 1.0}},
    )
    started = time.monotonic()
    assert sup.run() == 0
    assert all(p.poll() is not None for p in sup.processes.values())
    assert not pid_alive(sup.processes["trainer-0"].pid)
    assert time.monotonic() - started < 120  # a hang would block far longer


def test_a_slow_stage_does_not_cost_the_event_log_its_clean_exit(tmp_path) -> None:
    # the instance outlasts the whole shared grace; the stages after it still get their own
    sup = make_supervisor(tmp_path, {"rollout-0": {"slow_stop_s": 7.0}, "coordinator": {"finish_after_s": 1.0}})
    assert sup.run() == 0
    logger_log = (sup.run_dir.path / "logs" / "logger.log").read_text()
    assert "reason='shutdown" in logger_log and "reason=SIGTERM" not in logger_log, logger_log


def test_ctrl_c_stops_every_process(tmp_path) -> None:
    roles = ["ps", "rollout", "trainer", "router", "coordinator"]
    cmd = [
        sys.executable,
        "-m",
        "psrl.cli.main",
        "launch",
        "demo",
        "--root",
        str(tmp_path),
        "--name",
        "ctrlc",
        "--quiet",
        *[a for r in roles for a in ("--actor-class", f"{r}={FAKE}")],
    ]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "ctrlc"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = (run / "run.json").read_text() if (run / "run.json").exists() else ""
        if '"running"' in state:
            break
        time.sleep(0.2)
    from psrl.rundir import RunDir

    pids: list[int] = []
    while time.monotonic() < deadline and len(pids) < len(roles):  # the logger may not have written them yet
        pids = [e.message.pid for e in logged_events(RunDir(run)) if isinstance(e.message, ActorStarted)]
        time.sleep(0.2)
    launcher.send_signal(signal.SIGINT)
    stopped_at = time.monotonic()
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, out
    assert time.monotonic() - stopped_at < 10
    assert pids and not [p for p in pids if pid_alive(p)]
