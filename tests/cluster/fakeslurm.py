"""A real Slurm for tests: Debian's slurmctld, slurmd and munge, the nodes in network namespaces.

The controller runs in the root namespace on the bridge's address; each node is a network and UTS
namespace (its own address and hostname, as the multi-host test's fake hosts) running its own
slurmd. One munged (its own key and socket, in the work directory) authenticates them all: its
socket is a file every namespace sees. Nothing touches the system's Slurm or munge configuration;
clients find this cluster through ``SLURM_CONF``. Everything is torn down by PID and name.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.multihost.fakehosts import FakeHosts

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "ip", "unshare", "nsenter")


def can_run_slurm() -> str | None:
    """None when a fake Slurm can be made here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (ip netns, slurmd)"
    for tool in DAEMONS:
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"needs {tool} (apt-get install slurm-wlm munge iproute2)"
    return None


def _which(tool: str) -> str:
    return shutil.which(tool) or f"/usr/sbin/{tool}"


@dataclass
class FakeSlurm:
    workdir: Path
    names: tuple[str, ...] = ("n1", "n2")
    cpus: int = 4
    subnet: str = "10.97.0"
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.net = _NodesOnly(self.workdir / "net", self.names, self.subnet, tag=f"s{os.getpid() % 100000}")

    @property
    def conf(self) -> Path:
        return self.workdir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def up(self) -> FakeSlurm:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.net.up()
        self._start_munge()
        self._write_conf()
        self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for name in self.names:
            ns = self.net.namespace(name)
            # nsenter, not `ip netns exec`: that remounts /sys, and slurmd needs the cgroup mounts under it
            hosts = Path("/etc/netns") / ns / "hosts"
            self._start(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "sh", "-c",
                         f"mount --bind {hosts} /etc/hosts && hostname {name} && "
                         f"exec {_which('slurmd')} -D -N {name} -f {self.conf}"])  # fmt: skip
        self._wait_idle()
        return self

    def _start_munge(self) -> None:
        key = self.workdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_dir = self.workdir / "munge"
        munge_dir.mkdir(mode=0o700, exist_ok=True)
        self._start([_which("munged"), "-F", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                     f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={munge_dir / 'munged.log'}",
                     f"--seed-file={munge_dir / 'munged.seed'}"])  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(munge_dir / 'munged.log').read_text()[-2000:]}")
            time.sleep(0.1)

    @property
    def munge_socket(self) -> Path:
        return self.workdir / "munge" / "munge.socket"

    def _write_conf(self) -> None:
        state = self.workdir / "state"
        state.mkdir(exist_ok=True)
        lines = [
            "ClusterName=psrltest",
            f"SlurmctldHost={socket.gethostname()}({self.net.launcher_address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={state}/slurmd-%n",
            f"SlurmctldPidFile={state}/slurmctld.pid",
            f"SlurmdPidFile={state}/slurmd-%n.pid",
            f"SlurmctldLogFile={state}/slurmctld.log",
            f"SlurmdLogFile={state}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",  # the nodes' CPU count is the test's, not the machine's
            "ReturnToService=2",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "KillWait=5",
            "InactiveLimit=0",
        ]
        for name in self.names:
            lines.append(f"NodeName={name} NodeAddr={self.net.address(name)} CPUs={self.cpus} State=UNKNOWN")
        lines.append(f"PartitionName=main Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, cmd: list[str]) -> None:
        with (self.workdir / f"{Path(cmd[0]).name}-{len(self.procs)}.out").open("wb") as log:
            self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def _wait_idle(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        out = ""
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True)
            out = done.stdout + done.stderr
            states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
            if done.returncode == 0 and all(states.get(n) == "idle" for n in self.names):
                return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm nodes not idle after {timeout_s:.0f} s: {out}; logs in {self.workdir / 'state'}")

    def sbatch(self, script: Path, *script_args: str, options: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> str:  # fmt: skip
        done = subprocess.run(["sbatch", "--parsable", *options, str(script), *script_args],
                              env={**self.env, **(env or {})},
                              capture_output=True, text=True, check=True, cwd=self.workdir)  # fmt: skip
        return done.stdout.strip().split(";")[0]

    def wait_job(self, job_id: str, timeout_s: float) -> str:
        """The job's final state (COMPLETED, FAILED, ...) once it left the queue."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = subprocess.run(["scontrol", "show", "job", job_id, "-o"], env=self.env, capture_output=True,
                                  text=True)  # fmt: skip
            state = next((f.split("=", 1)[1] for f in done.stdout.split() if f.startswith("JobState=")), "")
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(1.0)
        subprocess.run(["scancel", job_id], env=self.env, capture_output=True)
        raise AssertionError(f"job {job_id} still running after {timeout_s:.0f} s")

    def down(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.net.down()


class _NodesOnly(FakeHosts):
    """The fake hosts' namespaces and bridge, without their sshd (Slurm starts the processes)."""

    def __init__(self, workdir: Path, names: tuple[str, ...], subnet: str, tag: str) -> None:
        super().__init__(workdir, names, subnet, tag)

    def _start_sshd(self, name: str) -> None:
        return None

    def _wait_for_ssh(self, timeout_s: float = 20.0) -> None:
        return None
