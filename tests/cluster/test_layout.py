"""Cluster placement as pure planning: nodes and a topology in, hosts (roles, devices) out, and
every allocation that cannot hold the topology refused with the problem and the fix."""

from __future__ import annotations

import pytest

from launch.cluster import ClusterError, parse_target
from launch.cluster.layout import Node, demand_of, layout_hosts
from launch.cluster.ray_cluster import bundles_for, check_free
from launch.cluster.slurm import cpus_per_node, gpus_per_node, slurm_nodes, srun_prefix
from launch.plan import plan_actors, role_counts
from psrl.config import load_config


def nodes(gpus: int = 0, count: int = 2, cpus: float = 8.0) -> list[Node]:
    return [Node(f"n{i + 1}", f"10.0.0.{i + 1}", gpus, cpus, is_launcher=i == 0) for i in range(count)]


def layout(config_overrides: list[str], cluster: list[Node], cuda_default: bool = False):
    config = load_config("demo", config_overrides)
    demand = demand_of(config, role_counts(config), cuda_default=cuda_default)
    return config, layout_hosts(cluster, demand, starter="srun", source="the allocation", shared_dir=False)


def test_singletons_on_the_launcher_node_gpu_roles_one_device_each() -> None:
    config, hosts = layout(["topology.device=cuda", "topology.n_rollout_instances=3"], nodes(gpus=2))
    by_name = {h.name: h for h in hosts.hosts}
    assert {"coordinator", "router", "logger"} <= set(by_name["n1"].roles)
    assert by_name["n1"].is_local and not by_name["n2"].is_local and by_name["n2"].starter == "srun"
    devices = {**by_name["n1"].devices, **by_name["n2"].devices}
    assert devices == {"trainer-0": "0", "rollout-0": "1", "rollout-1": "0", "rollout-2": "1"}
    placed = {s.name: s.host.name for s in plan_actors(config, hosts) if s.host is not None}
    assert placed["trainer-0"] == "n1" and placed["rollout-0"] == "n1" and placed["rollout-1"] == "n2"


def test_rollout_gpus_lets_instances_share_as_on_one_machine() -> None:
    _, hosts = layout(["topology.device=cuda", "topology.n_rollout_instances=4", "topology.rollout_gpus=[1]"],
                      nodes(gpus=2, count=1))  # fmt: skip
    assert hosts.hosts[0].devices == {"trainer-0": "0", **{f"rollout-{i}": "1" for i in range(4)}}


def test_cpu_roles_spread_over_the_nodes_without_devices() -> None:
    _, hosts = layout(["topology.device=cpu"], nodes(count=3))
    assert sum(h.roles.get("rollout", 0) for h in hosts.hosts) == 2
    assert all(not h.devices for h in hosts.hosts)
    assert {h.name for h in hosts.hosts} == {"n1", "n2", "n3"}


def test_too_few_gpus_names_the_counts_and_the_fix() -> None:
    with pytest.raises(ClusterError, match=r"has 2 GPU\(s\) on 2 node\(s\), the topology needs 3.*fix: allocate"):
        layout(["topology.device=cuda"], nodes(gpus=1))


def test_too_few_cpus_and_no_launcher_node_are_refused() -> None:
    with pytest.raises(ClusterError, match=r"has 1 CPU\(s\), too few"):
        layout(["topology.device=cpu"], nodes(count=1, cpus=1))
    stray = [Node("n1", "10.0.0.1", 0, 8.0), Node("n2", "10.0.0.2", 0, 8.0)]
    with pytest.raises(ClusterError, match="does not run on a node of the cluster"):
        layout([], stray)


def test_colocate_is_refused_on_a_cluster() -> None:
    with pytest.raises(ClusterError, match=r"topology\.colocate=true is not supported with --cluster"):
        layout(["topology.colocate=true", "psrl.tms.range=all"], nodes(gpus=2))


def test_slurm_environment_is_read_as_slurm_writes_it() -> None:
    env = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURMD_NODENAME": "gpu01", "SLURM_GPUS_ON_NODE": "4",
           "SLURM_JOB_CPUS_PER_NODE": "16(x2)"}  # fmt: skip
    expanded = {"gpu[01-02]": "gpu01\ngpu02\n"}
    found = slurm_nodes(env, run=lambda cmd: expanded[cmd[-1]], resolve=lambda n: f"10.1.0.{n[-1]}")
    assert [(n.name, n.address, n.gpus, n.cpus, n.is_launcher) for n in found] == [
        ("gpu01", "10.1.0.1", 4, 16.0, True),
        ("gpu02", "10.1.0.2", 4, 16.0, False),
    ]
    assert cpus_per_node("4(x2),2", 3) == [4.0, 4.0, 2.0]
    assert gpus_per_node({"SLURM_GPUS_PER_NODE": "a100:8"}) == 8
    assert gpus_per_node({"SLURM_JOB_GPUS": "0,1,3"}) == 3
    with pytest.raises(ClusterError, match="not a Slurm allocation; fix: run psrl launch from an sbatch"):
        slurm_nodes({})
    assert srun_prefix("n2", gpus=2)[:3] == ["srun", "--overlap", "--nodes=1"] and "--gres=gpu:2" in srun_prefix(
        "n2", gpus=2
    )


def test_ray_bundles_and_the_free_resources_check() -> None:
    config = load_config("demo", ["topology.device=cuda", "topology.n_rollout_instances=4",
                                  "topology.rollout_gpus=[0,1]"])  # fmt: skip
    demand = demand_of(config, role_counts(config), cuda_default=False)
    bundles = dict(bundles_for(demand))
    assert bundles["trainer-0"] == {"CPU": 1.0, "GPU": 1.0}
    assert bundles["rollout-3"] == {"CPU": 1.0, "GPU": 0.5}  # four instances on two GPUs
    assert bundles["ps-1"] == {"CPU": 1.0}
    with pytest.raises(ClusterError, match=r"has 2 free GPU\(s\), the topology needs 3.*fix: add nodes"):
        check_free(list(bundles.items()), {"CPU": 64.0, "GPU": 2.0}, "10.0.0.1:6379")


def test_cluster_targets() -> None:
    assert parse_target("ray").address == "" and parse_target("ray:10.0.0.1:6379").address == "10.0.0.1:6379"
    assert parse_target("slurm").kind == "slurm"
    with pytest.raises(ClusterError, match="unknown cluster 'kube'"):
        parse_target("kube")
