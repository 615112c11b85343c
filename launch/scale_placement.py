"""Where `psrl scale` starts new rollout instances, and how many the run has room for.

`RolloutPlacement` is the interface the supervisor's scale controller (``launch.scale``) asks; a
cluster placement (a Ray placement group, a Slurm allocation) implements the same two methods and is
handed to the supervisor as ``Supervisor.rollout_placement`` before ``run()``. The default,
`HostPlacement`, knows the launching host and the hosts of the run's hosts file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from launch.hosts import Host, HostsFile
from psrl.config import Config
from psrl.coordination.scaling import scale_limit


class RolloutPlacement(Protocol):
    def limit(self) -> int:
        """The most rollout instances that may run at once (a request beyond it is refused)."""
        ...

    def host_for(self, index: int, active: list[str]) -> Host | None:
        """The host new instance ``index`` starts on, given the instances that serve now (None: this machine)."""
        ...


@dataclass(frozen=True)
class HostPlacement:
    """New instances on the hosts that already carry rollout instances, in turn (this machine without a
    hosts file); room for ``room`` instances in all."""

    room: int
    hosts: tuple[Host, ...] = ()

    def limit(self) -> int:
        return self.room

    def host_for(self, index: int, active: list[str]) -> Host | None:
        if not self.hosts:
            return None
        return self.hosts[index % len(self.hosts)]


# a cluster whose actors start in reserved resources places new instances itself (launch.cluster: "ray")
CLUSTER_PLACEMENTS: dict[str, RolloutPlacement] = {}


def default_placement(config: Config, hosts: HostsFile | None) -> RolloutPlacement:
    """The launching host's room (``topology.max_rollout_instances``, else one instance per listed rollout
    GPU, else per CPU core); with a hosts file, its rollout hosts, and no room beyond the file's count
    unless ``topology.max_rollout_instances`` gives it; on a cluster that registered a placement, that."""
    topology = config.topology
    started = topology.n_rollout_instances
    if hosts is not None:
        for host in hosts.hosts:
            if host.roles.get("rollout", 0) > 0 and host.starter in CLUSTER_PLACEMENTS:
                return CLUSTER_PLACEMENTS[host.starter]
        rollout_hosts = tuple(h for h in hosts.hosts if h.roles.get("rollout", 0) > 0)
        return HostPlacement(max(topology.max_rollout_instances, started), rollout_hosts)
    cores = os.cpu_count() or 1
    return HostPlacement(scale_limit(topology.max_rollout_instances, len(topology.rollout_gpus), cores, started))
