"""Fake hosts for multi-host tests: Linux network namespaces on one bridge, each with its own sshd.

Every namespace gets an address on a private /24 that exists only inside this machine, its own
hostname (UTS namespace) and an sshd that accepts one generated key. The root namespace is the
launching host (address .1 on the bridge). Everything is torn down by PID and name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def can_create_namespaces() -> str | None:
    """None when fake hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    for tool in ("ip", "sshd", "ssh", "ssh-keygen", "unshare"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"needs {tool} (apt-get install openssh-server iproute2)"
    return None


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@dataclass
class FakeHosts:
    workdir: Path
    names: tuple[str, ...] = ("h1", "h2", "h3")
    subnet: str = "10.99.0"
    tag: str = field(default_factory=lambda: f"p{os.getpid() % 100000}")
    sshd_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"br{self.tag}"[:15]

    @property
    def launcher_address(self) -> str:
        return f"{self.subnet}.1"

    def address(self, name: str) -> str:
        return f"{self.subnet}.{11 + self.names.index(name)}"

    def namespace(self, name: str) -> str:
        return f"{self.tag}-{name}"

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh_config"

    def ssh_command(self) -> str:
        return f"ssh -F {self.ssh_config}"

    def up(self) -> FakeHosts:
        self.workdir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(exist_ok=True)
        self._make_keys()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.launcher_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for name in self.names:
            self._add_host(name)
        for name in self.names:
            self._start_sshd(name)
        self._wait_for_ssh()
        return self

    def _make_keys(self) -> None:
        for key in ("id_ed25519", "hostkey"):
            if not (self.workdir / key).exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.workdir / key))
        auth = self.workdir / "authorized_keys"
        auth.write_text((self.workdir / "id_ed25519.pub").read_text())
        auth.chmod(0o600)
        lines = []
        for name in self.names:
            lines += [
                f"Host {name}",
                f"  HostName {self.address(name)}",
                "  User root",
                f"  IdentityFile {self.workdir / 'id_ed25519'}",
                "  StrictHostKeyChecking no",
                "  UserKnownHostsFile /dev/null",
                "  LogLevel ERROR",
                "  ConnectTimeout 5",
            ]
        self.ssh_config.write_text("\n".join(lines) + "\n")

    def _add_host(self, name: str) -> None:
        ns, veth = self.namespace(name), f"v{self.tag}{self.names.index(name)}"[:15]
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        entries = ["127.0.0.1 localhost"] + [f"{self.address(n)} {n}" for n in self.names]
        (etc / "hosts").write_text("\n".join(entries) + "\n")

    def _start_sshd(self, name: str) -> None:
        conf = self.workdir / f"sshd_{name}.conf"
        conf.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.address(name)}",
                    f"HostKey {self.workdir / 'hostkey'}",
                    f"PidFile {self.workdir / f'sshd_{name}.pid'}",
                    f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "SetEnv PYTHONUNBUFFERED=1",
                ]
            )
            + "\n"
        )
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        cmd = [
            "ip",
            "netns",
            "exec",
            self.namespace(name),
            "unshare",
            "--uts",
            "sh",
            "-c",
            f"hostname {name} && exec {sshd} -D -f {conf}",
        ]
        self.sshd_procs.append(subprocess.Popen(cmd))

    def _wait_for_ssh(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        for name in self.names:
            while True:
                probe = subprocess.run(
                    ["ssh", "-F", str(self.ssh_config), name, "hostname"], capture_output=True, text=True
                )
                if probe.returncode == 0 and probe.stdout.strip() == name:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {name} did not come up: {probe.stderr.strip()}")
                time.sleep(0.2)

    def down(self) -> None:
        for proc in self.sshd_procs:
            proc.terminate()
        for proc in self.sshd_procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name in self.names:
            subprocess.run(["ip", "netns", "del", self.namespace(name)], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / self.namespace(name), ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def run_in(self, name: str, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.namespace(name), *cmd], capture_output=True, text=True)
