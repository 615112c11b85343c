"""`psrl launch --cluster ray` on a real local Ray cluster (a head and worker nodes, each its own
raylet): the run trains with its trainer, shards and instances in a placement group on the worker
nodes; a worker node killed mid-run has its actors re-placed on the survivor and the run finishes,
or, when the survivor has no room, the run ends with the reason and a checkpoint and resumes on a
node added afterwards. Every run replays 100%."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import psrl
from bus.messages import ActorRestarted, InstanceStatus, TrainerProgress
from psrl.rundir import RunDir
from psrl.scale_request import ScaleError
from tests.system.launch_helpers import logged_events

ray = pytest.importorskip("ray", reason="the ray extra (make install-ray)")

from tests.cluster.rank_faults import (  # noqa: E402
    check_group_recovered,
    kill_ranks_one_at_a_time,
    wait_for_version,
)
from tests.cluster.raynodes import start_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]  # real clusters on a loaded 2-core machine

HOSTS_LINE = re.compile(r"^ray cluster \S+: (.*)$", re.M)


def launch(address: str, root: Path, name: str, steps: int, *overrides: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--cluster", f"ray:{address}",
           "--root", str(root), "--name", name, f"trainer.total_steps={steps}", "trainer.save_freq=2",
           "topology.cluster_strategy=SPREAD", "topology.warm_spares=0", "bus.handshake_timeout_s=300",
           *overrides]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def placed_roles(output: str) -> dict[str, set[str]]:
    """node id prefix -> actors' roles, from the launcher's hosts line."""
    line = HOSTS_LINE.search(output)
    assert line is not None, output
    nodes: dict[str, set[str]] = {}
    for part in line.group(1).split("; "):
        name, _address, *roles = part.split()
        if name.startswith("ray-"):
            nodes[name.removeprefix("ray-")] = {r.split(":")[0] for r in roles}
    return nodes


def read_hosts_line(launcher: subprocess.Popen[str]) -> str:
    assert launcher.stdout is not None
    lines = []
    for line in launcher.stdout:
        lines.append(line)
        if HOSTS_LINE.match(line):
            return "".join(lines)
    raise AssertionError("launcher ended before placing the run: " + "".join(lines))


def kill_node_without(cluster, nodes: dict[str, set[str]], role: str) -> str:
    """Kill (no grace) the worker node that holds actors but not ``role``; its node id prefix."""
    victim = next(prefix for prefix, roles in nodes.items() if role not in roles)
    node = next(n for n in cluster.worker_nodes if n.node_id.startswith(victim))
    cluster.remove_node(node, allow_graceful=False)
    return victim


def replay_ok(run_dir: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "psrl.cli.main", "replay", str(run_dir), "--check", "all"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done.stdout


def test_a_lost_node_s_actors_are_replaced_on_the_survivor_and_the_run_finishes(tmp_path) -> None:
    cluster = start_cluster(workers=2, cpus_per_worker=5)  # either worker can hold all 5 bundles
    try:
        steps = 14
        launcher = launch(cluster.address, tmp_path / "runs", "ray-loss", steps)
        head = read_hosts_line(launcher)
        nodes = placed_roles(head)
        assert len(nodes) == 2, head  # SPREAD: both workers hold bundles, the head none (no CPUs)
        run = RunDir(tmp_path / "runs" / "ray-loss")
        wait_for_version(run, launcher, 3)
        victim = kill_node_without(cluster, nodes, "trainer")
        out, _ = launcher.communicate(timeout=600)
        out = head + out
    finally:
        cluster.shutdown()
    assert launcher.returncode == 0, out[-6000:]
    events = logged_events(run)
    assert max(e.message.version for e in events if isinstance(e.message, TrainerProgress)) == steps
    restarted = {e.message.actor for e in events if isinstance(e.message, ActorRestarted)}
    lost_roles = nodes[victim]
    assert {a.rsplit("-", 1)[0] for a in restarted} >= lost_roles, (restarted, lost_roles)
    moved = re.findall(r"re-placed on a surviving node\s+actor=(\S+) lost=(\S+) node=(\S+)", out)
    assert {a for a, _, _ in moved} == restarted, out[-4000:]
    assert all(lost.startswith(victim) and not node.startswith(victim) for _, lost, node in moved), moved
    replay_ok(run.path)


def test_no_room_after_a_node_loss_ends_the_run_resumably_and_it_resumes_on_a_new_node(tmp_path) -> None:
    cluster = start_cluster(workers=2, cpus_per_worker=3)  # 5 bundles over 6 CPUs: no room after a loss
    try:
        launcher = launch(cluster.address, tmp_path / "runs", "ray-end", 40)
        head = read_hosts_line(launcher)
        nodes = placed_roles(head)
        run = RunDir(tmp_path / "runs" / "ray-end")
        wait_for_version(run, launcher, 3)
        kill_node_without(cluster, nodes, "trainer")
        out, _ = launcher.communicate(timeout=600)
        assert launcher.returncode == 1, out[-6000:]
        assert "left have no room for its bundle" in out and "resume with the same command and --name" in out, out
        checkpoints = sorted(p.name for p in run.checkpoints.iterdir())
        assert checkpoints, "no checkpoint to resume from"
        ended_at = max(e.message.version for e in logged_events(run) if isinstance(e.message, TrainerProgress))

        cluster.add_node(num_cpus=3)  # a replacement node: the same command resumes there
        cluster.wait_for_nodes()
        resumed = launch(cluster.address, tmp_path / "runs", "ray-end", ended_at + 3)
        out2, _ = resumed.communicate(timeout=600)
    finally:
        cluster.shutdown()
    assert resumed.returncode == 0, out2[-6000:]
    versions = [e.message.version for e in logged_events(run) if isinstance(e.message, TrainerProgress)]
    assert max(versions) == ended_at + 3
    replay_ok(run.path)


def test_trainer_ranks_on_two_nodes_re_form_after_each_is_killed(tmp_path) -> None:
    """Two data-parallel ranks (gloo) on different Ray nodes; each is killed once, one at a time: the
    group re-forms at trainer-0's rendezvous from the PS's committed version and the run finishes."""
    cluster = start_cluster(workers=2, cpus_per_worker=3)
    try:
        steps = 20
        launcher = launch(cluster.address, tmp_path / "runs", "ray-dp", steps, "topology.n_trainer_ranks=2")
        head = read_hosts_line(launcher)
        nodes = placed_roles(head)
        line = HOSTS_LINE.search(head)
        assert line is not None and all(p.count("trainer:") <= 1 for p in line.group(1).split("; ")), head
        assert sum("trainer" in roles for roles in nodes.values()) == 2, head  # one rank per node
        run = RunDir(tmp_path / "runs" / "ray-dp")
        kill_ranks_one_at_a_time(run, launcher, [1, 0])
        out, _ = launcher.communicate(timeout=600)
    finally:
        cluster.shutdown()
    assert launcher.returncode == 0, (head + out)[-6000:]
    check_group_recovered(run.path, steps, [0, 1])
    replay_ok(run.path)


def scale_when_room(run_dir: Path, ask: str, timeout_s: float = 180) -> Any:
    """`psrl.scale` again until the supervisor has the room (a drained instance holds its bundle until it exits)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return psrl.scale(str(run_dir), ask)
        except ScaleError as exc:
            if "room" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def test_psrl_scale_reuses_the_bundle_a_retired_instance_left(tmp_path) -> None:
    """A placement group cannot grow: an instance `psrl scale` adds takes a retired one's bundle (and its
    runner) on that node, growing past the reserved bundles is refused, and the run replays 100%."""
    cluster = start_cluster(workers=2, cpus_per_worker=3)
    try:
        launcher = launch(cluster.address, tmp_path / "runs", "ray-scale", 30)
        head = read_hosts_line(launcher)
        run = RunDir(tmp_path / "runs" / "ray-scale")
        try:
            wait_for_version(run, launcher, 2)
        except AssertionError:
            raise AssertionError(head + launcher.communicate(timeout=60)[0][-6000:]) from None
        down = psrl.scale(str(run.path), "rollout=1")
        up = scale_when_room(run.path, "rollout=2")
        with pytest.raises(ScaleError, match="room for 2"):
            psrl.scale(str(run.path), "rollout=+1")
        out, _ = launcher.communicate(timeout=600)
    finally:
        cluster.shutdown()
    assert launcher.returncode == 0, (head + out)[-6000:]
    assert down.removed == ("rollout-1",) and up.added == ("rollout-2",), (down, up)
    events = logged_events(run)
    served = {e.message.instance for e in events if isinstance(e.message, InstanceStatus) and e.message.num_running}
    assert "rollout-2" in served, "the added instance served requests"
    assert run.log_file("rollout-2").stat().st_size > 0, "the runner's log copy of the added instance"
    replay_ok(run.path)
