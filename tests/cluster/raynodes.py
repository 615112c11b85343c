"""A real local Ray cluster for tests: a head and worker nodes, each its own raylet with its own
resources (``ray.cluster_utils.Cluster``), with fast node-failure detection so a killed node is
noticed (and its placement-group bundles re-placed) within seconds.

Run as a script it starts one and prints its address, for trying `psrl launch --cluster ray:ADDRESS`
by hand: ``python -m tests.cluster.raynodes [WORKERS] [CPUS_PER_WORKER]``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

FAST_FAILURE_DETECTION = {"health_check_period_ms": 500, "health_check_failure_threshold": 4,
                          "health_check_initial_delay_ms": 1000}  # fmt: skip


def start_cluster(workers: int = 2, cpus_per_worker: int = 5) -> Any:
    """Head (no CPUs: the launcher's node, no bundles) and ``workers`` worker nodes."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "_system_config": FAST_FAILURE_DETECTION, "include_dashboard": False},
    )
    for _ in range(workers):
        cluster.add_node(num_cpus=cpus_per_worker)
    cluster.wait_for_nodes()
    return cluster


def worker_nodes(cluster: Any) -> list[Any]:
    return list(cluster.worker_nodes)


if __name__ == "__main__":
    ray_cluster = start_cluster(*(int(a) for a in sys.argv[1:3]))
    print(ray_cluster.address, flush=True)
    try:
        while True:
            time.sleep(1)
    finally:
        ray_cluster.shutdown()
