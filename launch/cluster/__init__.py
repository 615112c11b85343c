"""Cluster placement: `psrl launch --cluster ray[:ADDRESS]|slurm` (or ``topology.cluster``).

A cluster is turned into the hosts a hosts file would give (launch.cluster.layout), so the
supervisor, the bus, CURVE and the restart policy are the same as with ``--hosts``; only how an
actor starts on its node differs: a Slurm job step (launch.cluster.slurm) or a Ray actor
(launch.cluster.ray_cluster). Everything the cluster cannot do is refused before any actor starts.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from launch.cluster.layout import ClusterError, demand_of, layout_hosts
from launch.hosts import HostsFile
from launch.plan import role_counts
from psrl.config import Config

__all__ = ["ClusterError", "ClusterTarget", "open_cluster", "parse_target"]


@dataclass(frozen=True)
class ClusterTarget:
    kind: str  # "ray" or "slurm"
    address: str = ""  # a Ray cluster's address; "" = auto


def parse_target(text: str) -> ClusterTarget:
    kind, _, address = text.partition(":")
    if kind == "ray":
        return ClusterTarget("ray", address)
    if kind == "slurm" and not address:
        return ClusterTarget("slurm")
    raise ClusterError(f"unknown cluster {text!r}; use ray, ray:HEAD_ADDRESS:PORT or slurm")


@contextmanager
def open_cluster(target: ClusterTarget, config: Config) -> Iterator[HostsFile]:
    """The run's hosts on the cluster, held for the run (a Ray connection and its reservation)."""
    counts = role_counts(config)
    topo = config.topology
    if target.kind == "slurm":
        from launch.cluster.slurm import slurm_nodes, unreachable_nodes

        nodes = slurm_nodes()
        demand = demand_of(config, counts, cuda_default=any(n.gpus for n in nodes))
        hosts = layout_hosts(nodes, demand, starter="srun", source="the Slurm allocation",
                             shared_dir=topo.cluster_shared_dir)  # fmt: skip
        launcher = next(n for n in nodes if n.is_launcher)
        with _listening(launcher.address, config.bus.base_port) as port:
            _refuse_unreachable(unreachable_nodes(nodes, sys.executable, launcher.address, port), launcher.address)
        yield hosts
        return
    from launch.cluster.ray_cluster import RayCluster

    with RayCluster(target.address).connect() as cluster:
        has_gpus = cluster.ray.cluster_resources().get("GPU", 0) > 0
        demand = demand_of(config, counts, cuda_default=has_gpus)
        hosts = cluster.reserve(demand, strategy=topo.cluster_strategy, shared_dir=topo.cluster_shared_dir)
        _refuse_unreachable(cluster.probe_bus(_free_port(cluster.launcher_ip, config.bus.base_port)),
                            cluster.launcher_ip)  # fmt: skip
        from launch.process import STARTERS
        from launch.scale_placement import CLUSTER_PLACEMENTS

        STARTERS["ray"] = cluster.start
        CLUSTER_PLACEMENTS["ray"] = cluster.rollout_placement(hosts)
        try:
            yield hosts
        finally:
            STARTERS.pop("ray", None)
            CLUSTER_PLACEMENTS.pop("ray", None)


def _refuse_unreachable(problems: list[str], launcher: str) -> None:
    if problems:
        lines = "\n  ".join(problems)
        raise ClusterError(
            f"{len(problems)} node(s) cannot reach the launcher's bus at {launcher}; nothing was started:\n  {lines}\n"
            f"fix: let the nodes reach each other on tcp (a firewall or a network the nodes do not share), or "
            f"bind the bus to an address they reach (bus.host)"
        )


@contextmanager
def _listening(address: str, preferred_port: int) -> Iterator[int]:
    """A listening socket on the launcher's address for the nodes' probes (the preferred port or a free one)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((address, preferred_port))
        except OSError:
            listener.bind((address, 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def _free_port(address: str, preferred_port: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind((address, preferred_port))
        except OSError:
            probe.bind((address, 0))
        return int(probe.getsockname()[1])
