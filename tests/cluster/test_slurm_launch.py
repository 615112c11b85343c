"""`psrl launch --cluster slurm` on a real Slurm (Debian's slurmctld, slurmd, munge): a controller
and two nodes in network namespaces. `sbatch examples/slurm/psrl.sbatch` trains across both nodes
(actors on the second node are job steps, no ssh) and the run replays 100%; an allocation that
cannot hold the topology fails before any actor starts, with the problem and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bus.messages import Hello, TrainerProgress
from psrl.rundir import RunDir
from tests.cluster.fakeslurm import FakeSlurm, can_run_slurm
from tests.cluster.rank_faults import check_group_recovered, kill_ranks_one_at_a_time
from tests.system.launch_helpers import logged_events

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "psrl.sbatch"
PSRL = str(Path(sys.executable).with_name("psrl"))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = can_run_slurm()
    if reason is not None:
        pytest.skip(f"fake Slurm unavailable: {reason}")
    cluster = FakeSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.up()
    finally:
        cluster.down()


def submit(slurm: FakeSlurm, root: Path, name: str, *overrides: str, while_running=None) -> tuple[str, str]:
    env = {"PSRL": PSRL, "PSRL_ROOT": str(root), "PSRL_RUN_NAME": name}
    job = slurm.sbatch(EXAMPLE, *overrides, options=(f"--output={root.parent}/{name}-%j.out",), env=env)
    if while_running is not None:
        while_running()
    state = slurm.wait_job(job, timeout_s=600)
    return state, (root.parent / f"{name}-{job}.out").read_text()


def test_sbatch_of_the_example_trains_across_two_nodes_and_replays(slurm, tmp_path) -> None:
    steps = 5
    root = tmp_path / "runs"
    state, out = submit(slurm, root, "slurm-demo", "demo", f"trainer.total_steps={steps}",
                        "bus.handshake_timeout_s=300")  # fmt: skip
    assert state == "COMPLETED", out[-6000:]
    assert "the Slurm allocation: n1 10.97.0.11" in out and "n2 10.97.0.12" in out, out[-3000:]
    run = RunDir(root / "slurm-demo")
    events = logged_events(run)
    assert max(e.message.version for e in events if isinstance(e.message, TrainerProgress)) == steps
    hosts = {e.envelope.sender: e.message.host for e in events if isinstance(e.message, Hello)}
    assert hosts["coordinator"] == "n1" and hosts["router"] == "n1", hosts
    on_n2 = sorted(name for name, host in hosts.items() if host == "n2")
    assert on_n2 and {n.rsplit("-", 1)[0] for n in on_n2} <= {"trainer", "ps", "rollout"}, hosts
    assert (run.keys / "server.key_secret").exists()  # CURVE across nodes, as with --hosts
    replay = subprocess.run([sys.executable, "-m", "psrl.cli.main", "replay", str(run.path), "--check", "all"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-2000:]
    assert "disagree" not in replay.stdout.lower() or " 0 disagree" in replay.stdout.lower()


def test_trainer_ranks_on_both_nodes_re_form_after_one_is_killed(slurm, tmp_path) -> None:
    """Two data-parallel ranks (gloo) on the two nodes, each in its own network namespace: rank 1 is
    killed mid-run, the group re-forms across the nodes from the PS's committed version, the run ends."""
    root, steps = tmp_path / "runs", 16
    run = RunDir(root / "slurm-dp")

    class Launcher:  # the job, for the fault helper: "running" until the run directory says it ended
        def poll(self) -> int | None:
            status = run.read_state().get("status") if run.state.exists() else "starting"
            return None if status in ("starting", "running") else 1

    def kill_rank_1() -> None:
        kill_ranks_one_at_a_time(run, Launcher(), [1])  # type: ignore[arg-type]

    state, out = submit(slurm, root, "slurm-dp", "demo", f"trainer.total_steps={steps}", "topology.n_trainer_ranks=2",
                        "trainer.save_freq=4", "bus.handshake_timeout_s=300", while_running=kill_rank_1)  # fmt: skip
    assert state == "COMPLETED", out[-6000:]
    hosts = {e.envelope.sender: e.message.host for e in logged_events(run) if isinstance(e.message, Hello)}
    assert {hosts["trainer-0"], hosts["trainer-1"]} == {"n1", "n2"}, hosts
    check_group_recovered(run.path, steps, [0, 1])


def test_an_allocation_without_the_gpus_the_topology_needs_fails_before_starting(slurm, tmp_path) -> None:
    root = tmp_path / "runs"
    state, out = submit(slurm, root, "slurm-nogpu", "demo", "topology.device=cuda")
    assert state == "FAILED", out[-3000:]
    assert "has 0 GPU(s) on 2 node(s), the topology needs 3" in out, out[-3000:]
    assert "fix: allocate more GPUs" in out
    assert not (root / "slurm-nogpu").exists()  # nothing started: no run directory


def test_a_node_that_cannot_reach_the_launcher_is_named_before_anything_starts(slurm, tmp_path) -> None:
    """n2 loses its route to n1 (the launcher's node): the probe job step reports it, no actor starts."""
    namespace, launcher = slurm.net.namespace("n2"), slurm.net.address("n1")
    subprocess.run(["ip", "-n", namespace, "route", "add", "prohibit", f"{launcher}/32"], check=True)
    try:
        root = tmp_path / "runs"
        state, out = submit(slurm, root, "slurm-cut", "demo")
    finally:
        subprocess.run(["ip", "-n", namespace, "route", "del", "prohibit", f"{launcher}/32"], check=True)
    assert state == "FAILED", out[-3000:]
    assert f"1 node(s) cannot reach the launcher's bus at {launcher}; nothing was started" in out, out[-3000:]
    assert "n2 (10.97.0.12):" in out and "fix: let the nodes reach each other on tcp" in out
    assert not (root / "slurm-cut").exists()
