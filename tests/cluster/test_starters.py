"""How an actor on a cluster node is started and what its boot says: a Slurm job step instead of
ssh, the cluster's device choice, the run directory only where the node mounts it."""

from __future__ import annotations

from pathlib import Path

from launch.hosts import Host
from launch.placement import boot_run_dir, visible_gpus
from launch.plan import ActorSpec
from launch.process import STARTERS, actor_command, remote_shell
from psrl.config import load_config


def node(**kw: object) -> Host:
    return Host("n2", "10.0.0.2", {"rollout": 1}, **kw)  # type: ignore[arg-type]


def test_an_actor_on_a_slurm_node_is_a_job_step_with_the_node_s_gpus() -> None:
    host = node(starter="srun", devices={"rollout-0": "1"}, gpus=2)
    command = actor_command(ActorSpec("rollout-0", "rollout", 0, host))
    assert command[:8] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", "n2", "--kill-on-bad-exit=0",
                           "--quiet"]  # fmt: skip
    assert "--gres=gpu:2" in command and command[-3:-1] == ["sh", "-c"]
    assert command[-1].endswith("-u -m actors") and "ssh" not in command
    kill = remote_shell(ActorSpec("ps-0", "ps", 0, host), "kill -9 123")
    assert "--gres=gpu:2" not in kill and kill[-1] == "kill -9 123"  # a CPU actor's step asks for no GPU


def test_ssh_hosts_start_as_before() -> None:
    command = actor_command(ActorSpec("rollout-0", "rollout", 0, node(ssh=("ssh", "-p", "2222"))))
    assert command[:5] == ["ssh", "-p", "2222", "-o", "BatchMode=yes"] and command[5] == "n2"


def test_devices_come_from_the_cluster_layout_and_ray_chooses_its_own() -> None:
    topology = load_config("demo", ["topology.rollout_gpus=[3]"]).topology
    assert visible_gpus("rollout", 0, topology) == "3"  # one machine: topology.rollout_gpus
    assert visible_gpus("rollout", 0, topology, node(devices={"rollout-0": "1"})) == "1"
    assert visible_gpus("rollout", 0, topology, node(starter="ray")) is None  # the runner passes Ray's GPU on


def test_the_run_directory_only_where_the_node_mounts_it() -> None:
    run_dir = Path("/runs/r1")
    assert boot_run_dir(None, run_dir) == "/runs/r1"
    assert boot_run_dir(node(), run_dir) is None
    assert boot_run_dir(node(shares_run_dir=True), run_dir) == "/runs/r1"
    assert "ray" not in STARTERS  # registered only while a Ray cluster is open


def test_a_hosts_file_line_can_say_the_host_mounts_the_run_directory(tmp_path) -> None:
    from launch.hosts import parse_hosts_file

    path = tmp_path / "hosts.txt"
    path.write_text("a 10.0.0.1 coordinator router logger local=true\nb 10.0.0.2 trainer ps rollout shared=true\n")
    hosts = parse_hosts_file(path)
    assert [h.shares_run_dir for h in hosts.hosts] == [False, True] and hosts.hosts[1].starter == "ssh"
