"""What a demo launch costs in processes and model reads: a regression guard, not a timing.

Each actor starts once (no restarts), the spares are the configured count, every rollout instance
builds one engine and the trainer reads its checkpoint once; nothing loads a model twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bus.messages import ActorRestarted, ActorStarted
from launch.plan import plan_actors
from psrl.config import load_config
from psrl.rundir import RunDir
from tests.system.launch_helpers import logged_events

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

OVERRIDES = ["trainer.total_steps=2", "bus.handshake_timeout_s=120"]


def structured_events(run: RunDir, actor: str) -> Counter[str]:
    path = run.log_file(actor, structured=True)
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(json.loads(line).get("event", "") for line in lines if line.startswith("{"))


def test_a_demo_launch_starts_each_actor_once_and_reads_each_model_once(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--root", str(tmp_path), "--name", "run",
               *OVERRIDES]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=500, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    config = load_config("demo", OVERRIDES)
    run = RunDir(tmp_path / "run")
    events = [e.message for e in logged_events(run)]
    started = Counter(m.actor for m in events if isinstance(m, ActorStarted))
    expected = {spec.name for spec in plan_actors(config)}
    assert set(started) == expected and set(started.values()) == {1}, started
    assert not [m for m in events if isinstance(m, ActorRestarted)]
    spares = (done.stdout + done.stderr).count("spare started")
    # the fork server makes replacements as warm as a spare would: no spare imports beside the run
    assert config.topology.fork_server and spares == 0, done.stdout[-2000:]

    reads = {name: structured_events(run, name) for name in expected}
    engines = {name: c["engine_ready"] for name, c in reads.items() if c["engine_ready"]}
    assert engines == {f"rollout-{i}": 1 for i in range(config.topology.n_rollout_instances)}, engines
    models = {name: c["model_loaded"] for name, c in reads.items() if c["model_loaded"]}
    assert models == {"trainer-0": 1}, models  # the policy alone: no KL reference, no critic under GRPO
