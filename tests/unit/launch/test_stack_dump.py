"""An actor that does not stop: the launcher asks it for its threads' stacks before forcing it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from launch.plan import ActorSpec
from launch.process import ActorProcess

STUCK = """
import time
from actors.__main__ import prepare_process
from actors.boot import Boot
prepare_process(Boot(name="trainer-0", role="trainer", index=0, incarnation=0, config_yaml="", bus={}))
print("ready", flush=True)
def wait_for_a_lock_forever():
    time.sleep(600)
wait_for_a_lock_forever()
"""


def test_a_stuck_actor_writes_where_it_waits(tmp_path: Path) -> None:
    log_path = tmp_path / "stuck.log"
    with log_path.open("wb") as log:
        child = subprocess.Popen([sys.executable, "-c", STUCK], stdout=log, stderr=log, start_new_session=True)
        process = ActorProcess(ActorSpec("trainer-0", "trainer", 0, None), 0, child, time.monotonic(), log)
        try:
            deadline = time.monotonic() + 60
            while "ready" not in log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            stacks = process.dump_stacks(log_path, wait_s=1.0)
        finally:
            child.kill()
            child.wait()
    assert "wait_for_a_lock_forever" in stacks
    assert "ready" not in stacks  # only what the dump added


def test_an_exited_actor_has_no_stacks(tmp_path: Path) -> None:
    log_path = tmp_path / "gone.log"
    with log_path.open("wb") as log:
        child = subprocess.Popen([sys.executable, "-c", "pass"], stdout=log, stderr=log)
        child.wait()
        process = ActorProcess(ActorSpec("ps-0", "ps", 0, None), 0, child, time.monotonic(), log)
        assert process.dump_stacks(log_path) == ""
