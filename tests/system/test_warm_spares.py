"""Warm spares in a real run: a killed actor's replacement becomes a spare that imported torch ahead
of need, and serves sooner than one started cold in the same run."""

from __future__ import annotations

import os
import signal
import time

import pytest

from bus.messages import ActorStarted, Ready
from tests.system.launch_helpers import Background, logged_events, make_supervisor, wait_until

pytestmark = pytest.mark.system

TORCH_FAKE = "tests.fakes.actors:TorchFakeActor"
VICTIMS = ("rollout-0", "rollout-1")


def test_a_replacement_becomes_the_warm_spare_and_serves_sooner_than_a_cold_one(tmp_path) -> None:
    options = {name: {"actor_class": TORCH_FAKE} for name in VICTIMS}
    # the spare pool alone: forks of the fork server would make every start warm
    sup = make_supervisor(tmp_path, options, ["topology.warm_spares=1", "topology.fork_server=false"])
    bg = Background(sup).start()
    bg.wait_ready(120)
    wait_until(lambda: sup.spares_full, 180, "no warm spare became ready")
    killed_at = time.time()
    for name in VICTIMS:  # at once: one spare, so one replacement is warm and the other starts cold
        os.kill(sup.processes[name].pid, signal.SIGKILL)
    wait_until(lambda: all(sup.processes[n].incarnation == 1 and sup.processes[n].is_ready for n in VICTIMS), 180,
          "the replacements did not serve")  # fmt: skip
    wait_until(lambda: sup.spares_full, 180, "no new spare after the first was used")
    sup._end(0, "test done")
    assert bg.join(60) == 0, sup.end_reason
    events = logged_events(sup.run_dir)
    starts = {
        (e.message.actor, e.message.incarnation): e.message for e in events if isinstance(e.message, ActorStarted)
    }
    ready_at = {(e.envelope.sender, e.envelope.incarnation): e.envelope.wall_ns / 1e9
                for e in events if isinstance(e.message, Ready)}  # fmt: skip
    assert all(not starts[(name, 0)].warm for name in VICTIMS)  # launch starts are cold
    warm = [n for n in VICTIMS if starts[(n, 1)].warm]
    cold = [n for n in VICTIMS if not starts[(n, 1)].warm]
    assert len(warm) == 1 and len(cold) == 1, starts
    warm_s = ready_at[(warm[0], 1)] - killed_at
    cold_s = ready_at[(cold[0], 1)] - killed_at
    # the cold one pays the interpreter start and the torch import; the warm one its setup only
    assert warm_s < 0.7 * cold_s, f"warm replacement served after {warm_s:.2f} s, cold after {cold_s:.2f} s"
    spares_log = (sup.run_dir.path / "logs" / "spares.log").read_text()
    assert f"becomes {warm[0]} (incarnation 1)" in spares_log
    assert spares_log.count(": warm in ") >= 2  # the used spare was replaced


def test_no_spare_warms_beside_a_fork_server_and_one_does_once_the_server_is_gone(tmp_path) -> None:
    """A replacement forked from the fork server is as warm as a spare, whose imports would only take CPU from
    the run; once the server has died the run falls back to a spare."""
    sup = make_supervisor(tmp_path, {name: {"actor_class": TORCH_FAKE} for name in VICTIMS},
                          ["topology.warm_spares=1"])  # fmt: skip
    bg = Background(sup).start()
    bg.wait_ready(120)
    time.sleep(1.0)  # settled: a spare would be started now
    assert sup.fork_server is not None and sup.spares is not None
    assert not sup.keeps_spares and sup.spare_ready and not sup.spares.spares
    sup.fork_server.popen.kill()
    wait_until(lambda: sup.keeps_spares, 30, "the run did not notice its fork server died")
    wait_until(lambda: sup.spares_full and sup.spares is not None and len(sup.spares.spares) == 1, 180,
               "no warm spare after the fork server died")  # fmt: skip
    sup._end(0, "test done")
    assert bg.join(60) == 0, sup.end_reason
