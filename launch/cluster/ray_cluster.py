"""`psrl launch --cluster ray[:ADDRESS]`: the run's actors on a running Ray cluster.

1. connect (``ray.init(address=...)``; ``auto`` finds the cluster this machine belongs to);
2. reserve one placement-group bundle per trainer rank, rollout instance (``{"GPU": 1, "CPU": 1}``
   with ``topology.device=cuda``; instances that share GPUs through ``topology.rollout_gpus`` get a
   fraction) and PS shard (``{"CPU": 1}``), checked against the cluster's free resources first;
3. the bundles' nodes become hosts: one per node, its address the node's IP, so the bus and the
   CURVE keys work as with ``--hosts``; the launcher's machine runs the singleton roles;
4. each trainer / PS / rollout actor is an ``ActorRunner`` Ray actor in its bundle, which runs the
   psrl actor process on the node (launch.cluster.ray_runner); the psrl supervisor supervises it as
   any other actor (restarts, heartbeats, the event log).

An actor that exits is restarted in the same runner (its bundle stays reserved). When a node is
lost its actors die with their runners; the supervisor restarts them, and the restart waits for
Ray to re-place their bundles on the surviving nodes. An actor's bus address is
fixed for the run (peers dial it), so a bundle re-placed on a node with another IP cannot take it:
the run then ends with a ClusterError that says so, after the trainer's checkpoint, and the same
``psrl launch --cluster ray --name RUN`` resumes it on the nodes that are up.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.boot import Boot
from launch.cluster.layout import ClusterError, Demand, rollout_gpu_count
from launch.cluster.ray_placement import RayRolloutPlacement, RolloutBundles
from launch.hosts import SINGLETON_ROLES, Host, HostsFile
from launch.plan import ActorSpec, actor_name
from launch.process import ActorProcess
from psrl.errors import MissingExtraError

CONNECT_TIMEOUT_S = 10.0
PLACEMENT_TIMEOUT_S = 120.0
REPLACE_WAIT_S = 120.0  # for Ray to notice a lost node and re-place its bundles
NODE_ANSWER_TIMEOUT_S = 10.0  # a node that runs no task within this is taken as lost
NO_ROOM_GRACE_S = 10.0  # the surviving nodes' free resources cannot hold a lost bundle: give up after this
STATUS_INTERVAL_S = 0.3
LOST_EXIT_CODE = 137  # a runner that Ray reports dead: its node is gone or it was killed


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingExtraError("--cluster ray", "ray", "ray") from None
    return ray


def bundles_for(demand: Demand) -> list[tuple[str, dict[str, float]]]:
    """(actor name, resources) per trainer rank, rollout instance and PS shard, in that order."""
    counts = demand.counts
    gpu_share = 1.0
    if demand.uses_gpus and demand.rollout_gpus:
        gpu_share = rollout_gpu_count(counts["rollout"], demand.rollout_gpus) / counts["rollout"]
    bundles: list[tuple[str, dict[str, float]]] = []
    for role in ("trainer", "rollout", "ps"):
        gpus = 0.0 if role == "ps" or not demand.uses_gpus else (1.0 if role == "trainer" else gpu_share)
        for index in range(counts[role]):
            resources = {"CPU": 1.0, **({"GPU": gpus} if gpus else {})}
            bundles.append((actor_name(role, index, counts[role]), resources))
    return bundles


def check_free(bundles: list[tuple[str, dict[str, float]]], available: dict[str, float], address: str) -> None:
    """Refuse before reserving anything when the cluster's free resources cannot hold the bundles."""
    for resource in ("GPU", "CPU"):
        need = sum(r.get(resource, 0.0) for _, r in bundles)
        have = available.get(resource, 0.0)
        if need > have + 1e-9:
            what = "trainer ranks and rollout instances (topology.device=cuda)" if resource == "GPU" else "actors"
            raise ClusterError(
                f"the Ray cluster at {address} has {have:g} free {resource}(s), the topology needs {need:g} for its "
                f"{what}; fix: add nodes (`ray start --address=...` with --num-gpus/--num-cpus), free the cluster, "
                f"or lower topology.n_rollout_instances / n_trainer_ranks / n_ps_shards"
            )


@dataclass
class RayCluster:
    """The run's Ray connection, placement group and runners; use as a context manager."""

    address: str
    ray: Any = None
    pg: Any = None
    launcher_ip: str = ""
    bundle_of: dict[str, int] = field(default_factory=dict)
    children: dict[str, RayChild] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)  # the node each actor's runner was started on
    rollout_bundles: RolloutBundles | None = None  # set once `psrl scale` may place instances

    def connect(self) -> RayCluster:
        ray = self.ray = import_ray()
        target = self.address or "auto"
        _probe_gcs(target)
        try:
            ray.init(address=target, log_to_driver=False, logging_level="ERROR", namespace="psrl")
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            raise ClusterError(f"no Ray cluster at {target}: {exc}; fix: start one (`ray start --head`) or give its "
                               "address (--cluster ray:HEAD_IP:6379)") from None  # fmt: skip
        self.launcher_ip = ray.util.get_node_ip_address()
        return self

    def close(self) -> None:
        for child in self.children.values():
            child.stop_pump()
        if self.ray is not None and self.ray.is_initialized():
            if self.pg is not None:
                with contextlib.suppress(Exception):
                    self.ray.util.remove_placement_group(self.pg)
            self.ray.shutdown()

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ placement

    def reserve(self, demand: Demand, *, strategy: str, shared_dir: bool) -> HostsFile:
        """Reserve the bundles and turn their nodes into hosts (one per node, in node order)."""
        ray = self.ray
        bundles = bundles_for(demand)
        check_free(bundles, ray.available_resources(), self.address or "auto")
        from ray.util.placement_group import placement_group

        self.pg = placement_group([r for _, r in bundles], strategy=strategy, name=f"psrl-{int(time.time())}")
        try:
            ray.get(self.pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except Exception as exc:  # GetTimeoutError: resources exist but no node can hold a bundle
            raise ClusterError(
                f"Ray did not place the run's {len(bundles)} bundles within {PLACEMENT_TIMEOUT_S:.0f} s ({exc!r}); "
                f"a node must hold each bundle ({bundles[0][1]} for {bundles[0][0]}); fix: add nodes with those "
                f"resources or lower the topology's counts"
            ) from None
        return self._hosts(bundles, demand, shared_dir)

    def _hosts(self, bundles: list[tuple[str, dict[str, float]]], demand: Demand, shared_dir: bool) -> HostsFile:
        nodes = self.nodes()
        on_node = self.bundle_nodes()
        launcher = Host("launcher", self.launcher_ip, {r: 1 for r in SINGLETON_ROLES if demand.counts.get(r)},
                        is_local=True, starter="local", shares_run_dir=True)  # fmt: skip
        roles: dict[str, dict[str, int]] = {}
        for i, (name, _) in enumerate(bundles):
            role = name.rsplit("-", 1)[0]
            per_node = roles.setdefault(on_node[i], {})
            per_node[role] = per_node.get(role, 0) + 1
        hosts = [launcher]
        for node_id, node_roles in roles.items():
            ip = nodes[node_id]["NodeManagerAddress"]
            hosts.append(Host(f"ray-{node_id[:8]}", ip, node_roles, starter="ray", node_id=node_id,
                              shares_run_dir=shared_dir or ip == self.launcher_ip))  # fmt: skip
        hosts_file = HostsFile(f"ray cluster {self.address or 'auto'}", tuple(hosts))
        self._bind_bundles(bundles, on_node, hosts_file)
        return hosts_file

    def _bind_bundles(self, bundles: list[tuple[str, dict[str, float]]], on_node: dict[int, str],
                      hosts: HostsFile) -> None:  # fmt: skip
        """Actor i of a role runs in a bundle of that role on the node the hosts file puts it on."""
        free = {i: name.rsplit("-", 1)[0] for i, (name, _) in enumerate(bundles)}
        for role in ("trainer", "rollout", "ps"):
            for index, host in enumerate(hosts.placement(role)):
                bundle = next(i for i, r in free.items() if r == role and on_node[i] == host.node_id)
                del free[bundle]
                self.bundle_of[actor_name(role, index, demand_count(hosts, role))] = bundle

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["NodeID"]: n for n in self.ray.nodes()}

    def bundle_nodes(self) -> dict[int, str]:
        table = self.ray.util.placement_group_table(self.pg)
        return {int(i): node for i, node in table["bundles_to_node_id"].items()}

    # ------------------------------------------------------------------ start

    def rollout_placement(self, hosts: HostsFile) -> RayRolloutPlacement:
        """Where `psrl scale` puts new instances: in the rollout bundles retired instances left."""
        holder = {bundle: name for name, bundle in self.bundle_of.items() if name.startswith("rollout")}
        self.rollout_bundles = RolloutBundles(holder, self._has_exited)
        return RayRolloutPlacement(self.rollout_bundles, hosts, lambda b: self.bundle_nodes().get(b, ""), self._bind)

    def _has_exited(self, name: str) -> bool:
        child = self.children.get(name)
        return child is None or child.code is not None

    def _bind(self, name: str, bundle: int) -> None:
        self.bundle_of[name] = bundle

    def start(self, spec: ActorSpec, boot: Boot, log_path: Path) -> ActorProcess:
        """Start ``spec`` in its bundle; after a node loss, wait for Ray to re-place the bundle."""
        bundle = self.bundle_of[spec.name]
        previous = self.children.get(spec.name)
        if previous is None and self.rollout_bundles is not None:  # an added instance: its bundle's last runner
            previous = self.children.pop(self.rollout_bundles.inherited.pop(spec.name, ""), None)
        if previous is not None and previous.code != LOST_EXIT_CODE:  # the runner lives: the replacement runs in it
            child = RayChild.start_in(self.ray, previous.handle, spec, boot, log_path)
            self.children[spec.name] = child
            return ActorProcess(spec, boot.incarnation, child, time.monotonic(), log_path.open("ab"))
        if previous is not None:
            previous.kill()
            self._settle_lost_runner(bundle)
        node_id = self._live_node_of(bundle, spec)
        address = self.nodes()[node_id]["NodeManagerAddress"]
        if spec.host is not None and address != spec.host.address:
            raise ClusterError(
                f"{spec.name} lost its node {spec.host.name} ({spec.host.address}); Ray re-placed its bundle on "
                f"{address}, but its bus address is fixed for the run; the run ends here (the trainer checkpoints "
                f"on the way out); fix: resume it with the same command and --name, which places it on the nodes "
                f"that are up"
            )
        was_on = self.node_of.get(spec.name, spec.host.node_id if spec.host else None)
        if was_on is not None and node_id != was_on:
            from psrl.log import get_logger

            get_logger("psrl.launch").warning("re-placed on a surviving node", actor=spec.name, lost=was_on,
                                              node=node_id)  # fmt: skip
        self.node_of[spec.name] = node_id
        child = RayChild.create(self.ray, self.pg, bundle, spec, boot, log_path)
        self.children[spec.name] = child
        return ActorProcess(spec, boot.incarnation, child, time.monotonic(), log_path.open("ab"))

    def _settle_lost_runner(self, bundle: int) -> None:
        """A runner Ray reported dead: if its node does not answer either, wait until Ray declares the
        node dead (and starts re-placing its bundles) rather than start the replacement there."""
        node_id = self.bundle_nodes().get(bundle, "")
        if not node_id or self._node_answers(node_id):
            return
        deadline = time.monotonic() + REPLACE_WAIT_S
        while time.monotonic() < deadline and self.nodes().get(node_id, {}).get("Alive", False):
            time.sleep(0.5)

    def _node_answers(self, node_id: str) -> bool:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from launch.cluster.ray_runner import node_answer

        task = self.ray.remote(num_cpus=0, max_retries=0)(node_answer)
        ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
        try:
            return bool(self.ray.get(ref, timeout=NODE_ANSWER_TIMEOUT_S))
        except Exception:  # GetTimeoutError, a dead node's scheduling error
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)
            return False

    def _live_node_of(self, bundle: int, spec: ActorSpec) -> str:
        """The bundle's node once it is alive; a lost node's bundles wait for Ray to re-place them,
        and give up when no node has room for NO_ROOM_GRACE_S (or REPLACE_WAIT_S in all)."""
        started = time.monotonic()
        no_room_since: float | None = None
        while True:
            nodes = self.nodes()
            node_id = self.bundle_nodes().get(bundle, "")
            if node_id in nodes and nodes[node_id]["Alive"]:
                return node_id
            now = time.monotonic()
            room = _fits(self.pg.bundle_specs[bundle], self.ray.available_resources())
            no_room_since = None if room else (no_room_since or now)
            if now - started > REPLACE_WAIT_S or (no_room_since is not None and now - no_room_since > NO_ROOM_GRACE_S):
                alive = sum(1 for n in nodes.values() if n["Alive"])
                raise ClusterError(
                    f"{spec.name}'s node {spec.host.name if spec.host else '?'} is gone and the {alive} Ray node(s) "
                    f"left have no room for its bundle {self.pg.bundle_specs[bundle]}; the run ends here (the trainer "
                    f"checkpoints on the way out); fix: add a node (`ray start --address=...`), then resume with the "
                    f"same command and --name"
                )
            time.sleep(0.5)

    def probe_bus(self, port: int) -> list[str]:
        """'NODE: why' for every node of the run that cannot reach the launcher's address on ``port``."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from launch.cluster.ray_runner import probe_connect

        remote = self.ray.remote(num_cpus=0)(probe_connect)
        nodes = sorted(set(self.bundle_nodes().values()))
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.launcher_ip, port))
            listener.listen(16)
            refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                    .remote(self.launcher_ip, port) for n in nodes]  # fmt: skip
            answers = self.ray.get(refs, timeout=60)
        return [f"ray node {n[:8]}: {why}" for n, why in zip(nodes, answers, strict=True) if why]


def _fits(bundle: dict[str, float], available: dict[str, float]) -> bool:
    return all(available.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())


def demand_count(hosts: HostsFile, role: str) -> int:
    return hosts.count(role)


def _probe_gcs(target: str) -> None:
    """A quick TCP check of HOST:PORT before ray.init, which would wait much longer to fail."""
    if target == "auto" or ":" not in target or target.startswith("ray://"):
        return
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ClusterError(
            f"no Ray cluster at {target} ({exc}); fix: start one there (`ray start --head --port={port}`) or give "
            "the head's address: --cluster ray:HEAD_IP:6379"
        ) from None


class RayChild:
    """The launcher's handle on a runner: what the supervisor uses of a process (launch.process.Child).

    A pump thread asks the runner for its status every STATUS_INTERVAL_S, copies the new log bytes
    into the run directory's log and keeps the exit code; a runner Ray reports dead (its node lost)
    exits with LOST_EXIT_CODE."""

    def __init__(self, ray: Any, handle: Any, spec: ActorSpec, log_path: Path, info: dict[str, Any]) -> None:
        self.ray, self.handle, self.spec = ray, handle, spec
        self.info = info
        self.code: int | None = None
        self.why: str | None = None
        self.stdin = None
        self._offset = int(info.get("offset", 0))
        self._log = log_path.open("ab")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"ray-{spec.name}", daemon=True)
        self._thread.start()

    @classmethod
    def create(cls, ray: Any, pg: Any, bundle: int, spec: ActorSpec, boot: Boot, log_path: Path) -> RayChild:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from launch.cluster.ray_runner import ActorRunner

        resources = pg.bundle_specs[bundle]
        runner = ray.remote(ActorRunner).options(
            num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0), max_concurrency=1, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
        )  # fmt: skip
        host = spec.host
        handle = runner.remote(spec.name, host.python if host else None, host.workdir if host else None)
        return cls.start_in(ray, handle, spec, boot, log_path)

    @classmethod
    def start_in(cls, ray: Any, handle: Any, spec: ActorSpec, boot: Boot, log_path: Path) -> RayChild:
        """Start the actor's process in the runner ``handle`` (new, or the one its predecessor ran in)."""
        try:
            info = ray.get(handle.start.remote(boot.to_json()), timeout=PLACEMENT_TIMEOUT_S)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.kill(handle)
            raise ClusterError(f"{spec.name} did not start on its Ray node: {exc!r}") from None
        return cls(ray, handle, spec, log_path, info)

    @property
    def pid(self) -> int:
        return int(self.info.get("pid", -1))

    def _pump(self) -> None:
        try:
            self._follow()
        finally:
            self._log.close()

    def _follow(self) -> None:
        while not self._stop.is_set() and self.code is None:
            try:
                code, data = self.ray.get(self.handle.status.remote(self._offset), timeout=30)
            except Exception as exc:  # the runner is gone: its node was lost or it was killed
                self.why = f"its Ray runner died ({type(exc).__name__})"
                self._write(f"[psrl launcher] {self.spec.name}: {self.why}\n".encode())
                self.code = LOST_EXIT_CODE
                return
            self._write(data)
            self._offset += len(data)
            if code is not None and not data:
                self.code = code
                return
            self._stop.wait(STATUS_INTERVAL_S)

    def _write(self, data: bytes) -> None:
        if data and not self._log.closed:
            self._log.write(data)
            self._log.flush()

    def poll(self) -> int | None:
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        self._thread.join(timeout)
        if self.code is None:
            raise subprocess.TimeoutExpired(self.spec.name, timeout or 0)
        return self.code

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(Exception):
            self.ray.get(self.handle.signal.remote(signum), timeout=10)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(self.handle)

    def close_stdin(self) -> None:
        with contextlib.suppress(Exception):
            self.handle.close_stdin.remote()

    def stop_pump(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.kill()
