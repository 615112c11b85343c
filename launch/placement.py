"""Which GPUs an actor process may see: trainer ranks and rollout instances on their own devices.

Placement works through CUDA_VISIBLE_DEVICES, set in the actor process before CUDA starts, so every
actor keeps addressing its device as cuda:0 and the same boot line works on a remote host.
"""

from __future__ import annotations

from pathlib import Path

from launch.hosts import Host
from psrl.config import Config
from psrl.config.system import Topology


def visible_gpus(role: str, index: int, topology: Topology, host: Host | None = None) -> str | None:
    """The CUDA_VISIBLE_DEVICES value of actor ``role``/``index``; None leaves the environment alone.

    On a cluster node the cluster's layout chose the device (``host.devices``, node-local indices);
    on a Ray node Ray chose it, and the node's runner passes it on (launch.cluster.ray_runner)."""
    if host is not None and host.starter == "ray":
        return None
    if host is not None and host.devices:
        return host.devices.get(f"{role}-{index}")
    if role == "trainer" and topology.trainer_gpus:
        return str(topology.trainer_gpus[index % len(topology.trainer_gpus)])
    if role == "rollout" and topology.rollout_gpus:
        return str(topology.rollout_gpus[index % len(topology.rollout_gpus)])
    return None


def memory_saver_preload(role: str, config: Config) -> str | None:
    """The library trainer and rollout processes start with preloaded (``LD_PRELOAD``) when torch-memory-saver
    must release captured CUDA graphs (``psrl.tms.enable_cuda_graph``); None: no preload."""
    if not config.psrl.tms.enable_cuda_graph or role not in ("trainer", "rollout"):
        return None
    from psrl.tms.backend import preload_library

    return preload_library()


def boot_run_dir(host: Host | None, run_dir: Path) -> str | None:
    """The run directory an actor writes (checkpoints, snapshots, its json log), or None on a host that
    does not mount it: one started directly, or one that shares the launcher's filesystem."""
    if host is None or host.is_local or host.shares_run_dir:
        return str(run_dir)
    return None
