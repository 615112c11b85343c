"""Local actors forked from the fork server: started with their imports done, watched, replaced, and
ended by their lifeline exactly like fresh interpreters; a demo launch imports its modules once."""

from __future__ import annotations

import os
import signal

import pytest

from bus.messages import ActorStarted, TrainerProgress
from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.rundir import RunDir
from tests.system.launch_helpers import Background, logged_events, make_supervisor, wait_until

pytestmark = pytest.mark.system


def test_forked_actors_serve_die_are_replaced_and_follow_their_lifeline(tmp_path) -> None:
    sup = make_supervisor(tmp_path, overrides=["topology.warm_spares=0"])
    bg = Background(sup).start()
    bg.wait_ready(120)
    assert sup.fork_server is not None and sup.fork_server.is_alive
    forked = {name for name, p in sup.processes.items() if p.warm}
    assert forked == {s.name for s in sup.specs if s.role != "logger"}, "every actor but the logger is a fork"

    victim = sup.processes["rollout-0"]
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: victim.poll() is not None, 10, "the server did not report the death")
    assert victim.poll() == -signal.SIGKILL, "exit codes as subprocess reports them"
    wait_until(lambda: sup.processes["rollout-0"].incarnation == 1 and sup.processes["rollout-0"].is_ready, 60,
          "no replacement served")  # fmt: skip
    assert sup.processes["rollout-0"].warm

    lifeline = sup.processes["rollout-1"]
    lifeline.close_stdin()  # as if the launcher were gone: the actor stops by itself
    wait_until(lambda: lifeline.poll() is not None, 30, "an actor outlived its lifeline")
    sup._end(0, "test done")
    assert bg.join(60) == 0
    assert sup.fork_server is not None and not sup.fork_server.is_alive


def test_a_demo_launch_imports_once_and_loads_each_model_once(tmp_path) -> None:
    config = load_config("demo", ["trainer.total_steps=2", "topology.warm_spares=0"])
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "costs"))
    assert sup.run() == EXIT_OK, sup.end_reason
    events = logged_events(sup.run_dir)
    starts = [e.message for e in events if isinstance(e.message, ActorStarted)]
    fresh = sorted(s.actor for s in starts if not s.warm)
    assert fresh == ["logger"], f"fresh interpreters besides the fork server: {fresh}"
    assert len(starts) == len(sup.specs), "one process per actor, none started twice"
    first = next(s.actor for s in starts if s.actor != "logger")
    assert first == "trainer-0", "the trainer's class is forked first"
    assert max(e.message.version for e in events if isinstance(e.message, TrainerProgress)) == 2
    logs = sup.run_dir.path / "logs"
    engines = sum((logs / f"rollout-{i}.log").read_text().count("engine_ready") for i in range(2))
    assert engines == config.topology.n_rollout_instances, "each instance builds its engine once"
