"""Which actors a run has, where each runs, and the address each one serves requests on.

Pure planning from the config (and the hosts file): no processes, no sockets. On one machine
every request socket is an ``ipc://`` file in the run's bus directory; across hosts each actor
binds tcp on its host's address at ``bus.base_port + 4 * slot`` (+0..3 for its sockets).
"""

from __future__ import annotations

from dataclasses import dataclass

from launch.hosts import Host, HostsFile
from psrl.config import Config

# Start order; shutdown runs in reverse, the logger last.
ROLE_ORDER = ("logger", "ps", "rollout", "trainer", "router", "session", "coordinator")
PORTS_PER_ACTOR = 4


@dataclass(frozen=True)
class ActorSpec:
    name: str
    role: str
    index: int
    host: Host | None  # None = this machine, started directly

    @property
    def host_name(self) -> str:
        return self.host.name if self.host is not None else "local"


def actor_name(role: str, index: int, count: int) -> str:
    return role if count == 1 and role in ("logger", "coordinator", "router", "session") else f"{role}-{index}"


def role_counts(config: Config) -> dict[str, int]:
    session = config.env.enable  # the session scheduler runs the environments of multi-turn sessions
    topo = config.topology
    return {
        "logger": 1,
        "ps": topo.n_ps_shards,
        "rollout": topo.n_rollout_instances,
        "trainer": topo.n_trainer_ranks,
        "router": 1,
        "session": 1 if session else 0,
        "coordinator": 1,
    }


def plan_actors(config: Config, hosts: HostsFile | None = None) -> list[ActorSpec]:
    """Every actor of the run in start order; with a hosts file, each placed on its host."""
    counts = role_counts(config)
    specs = []
    for role in ROLE_ORDER:
        placement = hosts.placement(role) if hosts is not None else []
        for index in range(counts[role]):
            host = placement[index] if index < len(placement) else _launcher_host(hosts)
            specs.append(ActorSpec(actor_name(role, index, counts[role]), role, index, host))
    return specs


def _launcher_host(hosts: HostsFile | None) -> Host | None:
    """Roles a hosts file does not place (logger, session) run on the launching host."""
    if hosts is None:
        return None
    local = [h for h in hosts.hosts if h.is_local]
    return local[0] if local else None


def hosts_overrides(hosts: HostsFile) -> list[str]:
    """Config overrides that make the topology match the hosts file's role counts."""
    return [
        f"topology.n_rollout_instances={hosts.count('rollout')}",
        f"topology.n_trainer_ranks={hosts.count('trainer')}",
        f"topology.n_ps_shards={hosts.count('ps')}",
    ]


def plan_endpoints(
    specs: list[ActorSpec], *, use_tcp: bool, ipc_directory: str, base_port: int, local_address: str
) -> dict[str, str]:
    """Request-socket address of every actor (``name``) and of its extra sockets (``name.1`` ...)."""
    endpoints: dict[str, str] = {}
    for slot, spec in enumerate(specs):
        address = spec.host.address if spec.host is not None else local_address
        for k in range(PORTS_PER_ACTOR):
            key = spec.name if k == 0 else f"{spec.name}.{k}"
            if use_tcp:
                endpoints[key] = f"tcp://{address}:{base_port + PORTS_PER_ACTOR * slot + k}"
            else:
                endpoints[key] = f"ipc://{ipc_directory}/{key}.sock"
    return endpoints
