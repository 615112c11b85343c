"""`psrl launch --cluster slurm`: the nodes and GPUs of the allocation the launcher runs in, and
every remote actor started as a job step (``srun --overlap``), no ssh.

The nodes come from ``SLURM_JOB_NODELIST`` expanded by ``scontrol show hostnames``; GPUs per node
from ``SLURM_GPUS_ON_NODE`` (or ``SLURM_JOB_GPUS``, ``SLURM_GPUS_PER_NODE``), CPUs from
``SLURM_JOB_CPUS_PER_NODE``. The launcher's node (``SLURMD_NODENAME``) runs the singleton roles and
its own share of the rest directly; each actor on another node is one ``srun --overlap --nodes=1
-w NODE`` step whose stdin is the actor's boot line and lifeline, as over ssh.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from launch.cluster.layout import ClusterError, Node

SRUN_TIMEOUT_S = 60.0
Runner = Callable[[list[str]], str]


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SRUN_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise ClusterError(f"{command[0]} not found: --cluster slurm runs inside a Slurm allocation on a node "
                           "with the Slurm client tools; fix: run it from sbatch/salloc") from None  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"`{shlex.join(command)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def slurm_nodes(env: Mapping[str, str] = os.environ, run: Runner = _run,
                resolve: Callable[[str], str] = socket.gethostbyname) -> list[Node]:  # fmt: skip
    """The allocation's nodes, the launcher's marked; ClusterError outside an allocation."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ClusterError("--cluster slurm: SLURM_JOB_NODELIST is not set, so this is not a Slurm allocation; "
                           "fix: run psrl launch from an sbatch script or inside salloc "
                           "(example: examples/slurm/psrl.sbatch)")  # fmt: skip
    names = [n for n in run(["scontrol", "show", "hostnames", nodelist]).split() if n]
    here = env.get("SLURMD_NODENAME") or socket.gethostname()
    gpus = gpus_per_node(env)
    cpus = cpus_per_node(env.get("SLURM_JOB_CPUS_PER_NODE", ""), len(names))
    nodes = []
    for i, name in enumerate(names):
        try:
            address = resolve(name)
        except OSError:
            raise ClusterError(
                f"Slurm node {name!r} does not resolve from {here}; fix: the nodes' names must resolve to the "
                "addresses they reach each other on (DNS or /etc/hosts)"
            ) from None
        nodes.append(Node(name, address, gpus, cpus[i], is_launcher=name == here))
    return nodes


def gpus_per_node(env: Mapping[str, str]) -> int:
    """GPUs the job has on each node (the allocation is taken as the same on every node)."""
    if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(env["SLURM_GPUS_ON_NODE"])
    job_gpus = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")
    if job_gpus:
        return len([g for g in job_gpus.split(",") if g])
    per_node = env.get("SLURM_GPUS_PER_NODE", "")  # "4" or "a100:4"
    match = re.search(r"(\d+)$", per_node)
    return int(match.group(1)) if match else 0


def cpus_per_node(text: str, num_nodes: int) -> list[float]:
    """``SLURM_JOB_CPUS_PER_NODE`` ("4(x2),2") expanded to one count per node (0 when unknown)."""
    counts: list[float] = []
    for part in filter(None, text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return [0.0] * num_nodes
        counts += [float(match.group(1))] * int(match.group(2) or 1)
    return counts if len(counts) == num_nodes else [0.0] * num_nodes


def srun_prefix(node: str, *, gpus: int = 0) -> list[str]:
    """A one-task job step on ``node`` that shares the job's resources with the other steps."""
    step = ["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", node, "--kill-on-bad-exit=0", "--quiet"]
    if gpus:  # where devices are constrained, a step sees only the GPUs it asks for
        step.append(f"--gres=gpu:{gpus}")
    return step


def step_command(node: str, shell_command: str, *, gpus: int = 0) -> list[str]:
    return [*srun_prefix(node, gpus=gpus), "sh", "-c", shell_command]


PROBE = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
    "except OSError as e:\n"
    "    sys.exit(f'cannot connect to {sys.argv[1]}:{sys.argv[2]}: {e}')\n"
)


def unreachable_nodes(nodes: list[Node], python: str, launcher: str, port: int) -> list[str]:
    """'NODE: why' for every other node that cannot start a job step or reach ``launcher:port``."""
    others = [n for n in nodes if not n.is_launcher]

    def probe(node: Node) -> str | None:
        command = [*srun_prefix(node.name), python, "-c", PROBE, launcher, str(port)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=SRUN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return f"no job step started within {SRUN_TIMEOUT_S:.0f} s"
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return None if done.returncode == 0 else (lines[-1] if lines else f"exit code {done.returncode}")

    if not others:
        return []
    with ThreadPoolExecutor(len(others)) as pool:
        answers = list(pool.map(probe, others))
    return [f"{n.name} ({n.address}): {why}" for n, why in zip(others, answers, strict=True) if why]
