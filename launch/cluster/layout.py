"""Which node of a cluster runs which actors: pure planning from the nodes and the topology.

A cluster (a Ray cluster, a Slurm allocation) is turned into the same ``HostsFile`` a hosts file
gives, so planning, endpoints, CURVE and supervision stay the launcher's own. The launcher's node
runs the coordinator, router, logger and session scheduler (they own the run directory and talk
to the bus proxy in the launcher); trainer ranks, parameter-server shards and rollout instances
are spread over the nodes, GPU roles onto nodes with free GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launch.hosts import SINGLETON_ROLES, Host, HostsFile
from psrl.config import Config

GPU_ROLES = ("trainer", "rollout")


class ClusterError(RuntimeError):
    """The cluster cannot run the topology as configured; the message names the problem and the fix."""


@dataclass(frozen=True)
class Node:
    name: str  # how the starter reaches it: a Slurm node name, a Ray node's label
    address: str  # the address its actors bind to
    gpus: int = 0
    cpus: float = 0.0
    is_launcher: bool = False  # the node the launcher runs on
    node_id: str | None = None


@dataclass(frozen=True)
class Demand:
    """What the topology asks of the cluster."""

    counts: dict[str, int]
    uses_gpus: bool
    trainer_gpus: tuple[int, ...] = ()
    rollout_gpus: tuple[int, ...] = ()

    @property
    def gpus(self) -> int:
        if not self.uses_gpus:
            return 0
        return self.counts["trainer"] + rollout_gpu_count(self.counts["rollout"], self.rollout_gpus)

    @property
    def actors_per_gpu_role(self) -> int:
        return self.counts["trainer"] + self.counts["rollout"]


def rollout_gpu_count(instances: int, rollout_gpus: tuple[int, ...]) -> int:
    """GPUs the instances need: one each, or fewer when ``topology.rollout_gpus`` lets them share
    (instance i sees rollout_gpus[i % n]: n GPUs for any number of instances)."""
    return min(instances, len(rollout_gpus)) if rollout_gpus else instances


def demand_of(config: Config, counts: dict[str, int], *, cuda_default: bool) -> Demand:
    """``topology.device=cuda`` (or auto where the cluster has GPUs) puts trainer and rollout on GPUs."""
    topo = config.topology
    if topo.colocate:
        raise ClusterError(
            "topology.colocate=true is not supported with --cluster (trainer and rollout would need the same "
            "node's GPUs); fix: set topology.colocate=false, or place them with --hosts"
        )
    uses_gpus = topo.device == "cuda" or (topo.device == "auto" and cuda_default)
    return Demand(counts, uses_gpus, tuple(topo.trainer_gpus), tuple(topo.rollout_gpus))


@dataclass
class _NodeSlots:
    node: Node
    roles: dict[str, int] = field(default_factory=dict)
    devices: dict[str, str] = field(default_factory=dict)
    used_gpus: list[int] = field(default_factory=list)


def layout_hosts(nodes: list[Node], demand: Demand, *, starter: str, source: str, shared_dir: bool) -> HostsFile:
    """A hosts file for ``nodes``: singleton roles on the launcher's node, trainer ranks and rollout
    instances on GPUs (node-local indices in ``Host.devices``) or spread over the nodes on CPUs,
    PS shards spread round robin. Raises ClusterError when the nodes cannot hold the topology."""
    launcher = [n for n in nodes if n.is_launcher]
    if not launcher:
        raise ClusterError(f"{source}: the launcher does not run on a node of the cluster; fix: start psrl launch "
                           "on one of its nodes (inside the allocation, or on a Ray node)")  # fmt: skip
    check_capacity(nodes, demand, source)
    slots = {n.name: _NodeSlots(n) for n in nodes}
    for role in SINGLETON_ROLES:
        if demand.counts.get(role, 0):
            slots[launcher[0].name].roles[role] = 1
    for role in GPU_ROLES:
        if demand.uses_gpus:
            _place_on_gpus(role, demand, list(slots.values()))
        else:
            _spread(role, demand.counts[role], list(slots.values()))
    _spread("ps", demand.counts["ps"], list(slots.values()))
    hosts = [_host(s, starter, shared_dir) for s in slots.values() if s.roles]
    return HostsFile(source, tuple(hosts))


def check_capacity(nodes: list[Node], demand: Demand, source: str) -> None:
    have = sum(n.gpus for n in nodes)
    if demand.gpus > have:
        raise ClusterError(
            f"{source} has {have} GPU(s) on {len(nodes)} node(s), the topology needs {demand.gpus} "
            f"({demand.counts['trainer']} trainer rank(s) + {demand.counts['rollout']} rollout instance(s), "
            f"topology.device=cuda); fix: allocate more GPUs (e.g. --gres=gpu:N per node), or lower "
            f"topology.n_rollout_instances / topology.n_trainer_ranks, or let instances share GPUs with "
            f"topology.rollout_gpus"
        )
    cpus = sum(n.cpus for n in nodes)
    actors = sum(demand.counts.values())
    if cpus and cpus < actors / 4:  # several light actors share a core; fewer than a quarter each is too few
        raise ClusterError(
            f"{source} has {cpus:g} CPU(s), too few for {actors} actor processes (at least {math.ceil(actors / 4)}); "
            f"fix: allocate more CPUs (e.g. --cpus-per-task) or lower the topology's counts"
        )


def _usable_gpus(node: Node, listed: tuple[int, ...]) -> list[int]:
    return [g for g in (listed or range(node.gpus)) if g < node.gpus]


def _place_on_gpus(role: str, demand: Demand, slots: list[_NodeSlots]) -> None:
    listed = demand.trainer_gpus if role == "trainer" else demand.rollout_gpus
    share = role == "rollout" and bool(listed)
    left = demand.counts[role]
    index = 0
    for slot in slots:
        free = [g for g in _usable_gpus(slot.node, listed) if g not in slot.used_gpus]
        if share:  # instances cycle over the listed GPUs of the node, as on one machine
            per_gpu = math.ceil(demand.counts[role] / max(1, rollout_gpu_count(demand.counts[role], listed)))
            free = [g for g in free for _ in range(per_gpu)]
        for gpu in free[:left]:
            slot.roles[role] = slot.roles.get(role, 0) + 1
            slot.devices[f"{role}-{index}"] = str(gpu)
            if gpu not in slot.used_gpus:
                slot.used_gpus.append(gpu)
            index += 1
        left = demand.counts[role] - index
        if not left:
            return
    where = ", ".join(f"{s.node.name}: {s.node.gpus}" for s in slots)
    raise ClusterError(
        f"not enough free GPUs for {demand.counts[role]} {role} actor(s) (GPUs per node: {where}; "
        f"topology.{role}_gpus={list(listed)}); fix: allocate more GPUs or lower the {role} count"
    )


def _spread(role: str, count: int, slots: list[_NodeSlots]) -> None:
    """Round robin over the nodes, the launcher's last (it already runs the singleton roles)."""
    order = sorted(slots, key=lambda s: s.node.is_launcher)
    for i in range(count):
        slot = order[i % len(order)]
        slot.roles[role] = slot.roles.get(role, 0) + 1


def _host(slot: _NodeSlots, starter: str, shared_dir: bool) -> Host:
    node = slot.node
    # the launcher's node runs its actors directly: the singletons must, and its others need no job step
    local = node.is_launcher
    return Host(
        name=node.name,
        address=node.address,
        roles=dict(slot.roles),
        is_local=local,
        starter="local" if local else starter,
        shares_run_dir=local or shared_dir,
        devices=dict(slot.devices),
        node_id=node.node_id,
        gpus=node.gpus,
    )
