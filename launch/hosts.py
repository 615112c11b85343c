"""The hosts file of `psrl launch --hosts hosts.txt`.

Format: one host per line, ``#`` starts a comment, blank lines are ignored::

    # name     address       roles (role or role:count)            options
    head       10.0.0.1      coordinator router logger ps:1 trainer
    gpu-a      10.0.0.2      rollout:2 ps:1                         python=/opt/psrl/.venv/bin/python
    gpu-b                    rollout:2                              ssh="ssh -p 2222"

* ``name``: how the launcher reaches the host (ssh destination). The address may be omitted, in
  which case the name is resolved; the address is what the host's actors bind to.
* roles: ``coordinator``, ``router``, ``logger``, ``session`` (one each in the whole file),
  ``trainer[:ranks]``, ``ps[:shards]``, ``rollout[:instances]``.
* options: ``python=`` (interpreter with psrl installed on that host; default: the launcher's own
  path), ``ssh=`` (command used to reach it; default ``ssh``), ``workdir=`` (remote working
  directory), ``local=true`` (start actors directly instead of over ssh), ``shared=true`` (the host
  mounts the run directory at the same path: its trainer ranks and shards checkpoint there).

`psrl launch --cluster ray|slurm` builds the same structure from the cluster (launch.cluster).

The bus proxy and the logger run on the launching host, which owns the run directory; the first
host that is the launching machine (``local=true`` or an address of this machine) takes them.
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SINGLETON_ROLES = ("coordinator", "router", "logger", "session")
COUNTED_ROLES = ("trainer", "ps", "rollout")
ROLES = SINGLETON_ROLES + COUNTED_ROLES
OPTIONS = ("python", "ssh", "workdir", "local", "shared")


class HostsFileError(ValueError):
    """A hosts file problem, with its line number."""

    def __init__(self, path: str, line_no: int, message: str) -> None:
        super().__init__(f"{path}:{line_no}: {message}")
        self.line_no = line_no


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    roles: dict[str, int]
    python: str | None = None
    ssh: tuple[str, ...] = ("ssh",)
    workdir: str | None = None
    is_local: bool = False
    line_no: int = 0
    # how its actors start: "ssh" (hosts file), "srun" (a Slurm job step), "ray" (a Ray actor on the node)
    starter: str = "ssh"
    shares_run_dir: bool = False  # mounts the launcher's run directory at the same path
    devices: dict[str, str] = field(default_factory=dict)  # actor name -> CUDA_VISIBLE_DEVICES, set by a cluster
    node_id: str | None = None  # the Ray node it stands for
    gpus: int = 0  # GPUs a cluster gives the job on this host (a Slurm job step asks for them all)


@dataclass(frozen=True)
class HostsFile:
    path: str
    hosts: tuple[Host, ...] = field(default_factory=tuple)

    def count(self, role: str) -> int:
        return sum(h.roles.get(role, 0) for h in self.hosts)

    def placement(self, role: str) -> list[Host]:
        """One entry per actor of ``role``, in file order (index i -> host of actor i)."""
        return [h for h in self.hosts for _ in range(h.roles.get(role, 0))]

    @property
    def spans_hosts(self) -> bool:
        return len(self.hosts) > 1


Resolver = Callable[[str], str]


def default_resolver(name: str) -> str:
    return socket.gethostbyname(name)


def parse_hosts_file(path: str | Path, resolve: Resolver = default_resolver) -> HostsFile:
    """Parse and check the whole file before anything starts; errors carry the line number."""
    text = Path(path).read_text()
    hosts: list[Host] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            hosts.append(_parse_line(str(path), line_no, line, resolve))
    _check_whole_file(str(path), hosts)
    return HostsFile(str(path), tuple(hosts))


def _parse_line(path: str, line_no: int, line: str, resolve: Resolver) -> Host:
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise HostsFileError(path, line_no, f"malformed line ({exc})") from None
    name, rest = tokens[0], tokens[1:]
    if "=" in name or ":" in name or name in ROLES:
        raise HostsFileError(path, line_no, f"a line starts with the host name, got {name!r}")
    address = None
    if rest and _looks_like_address(rest[0]):
        address, rest = rest[0], rest[1:]
    roles: dict[str, int] = {}
    options: dict[str, str] = {}
    for token in rest:
        if "=" in token:
            key, _, value = token.partition("=")
            if key not in OPTIONS:
                raise HostsFileError(path, line_no, f"unknown option {key!r} (known: {', '.join(OPTIONS)})")
            options[key] = value
        else:
            role, count = _parse_role(path, line_no, token)
            if role in roles:
                raise HostsFileError(path, line_no, f"role {role!r} appears twice on this line")
            roles[role] = count
    if not roles:
        raise HostsFileError(path, line_no, f"host {name!r} takes no role")
    return Host(
        name=name,
        address=address or _resolve(path, line_no, name, resolve),
        roles=roles,
        python=options.get("python"),
        ssh=tuple(shlex.split(options.get("ssh", "ssh"))),
        workdir=options.get("workdir"),
        is_local=_is_true(options.get("local", "false")),
        line_no=line_no,
        shares_run_dir=_is_true(options.get("shared", "false")),
    )


def _is_true(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


def _looks_like_address(token: str) -> bool:
    parts = token.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


def _parse_role(path: str, line_no: int, token: str) -> tuple[str, int]:
    role, _, count_text = token.partition(":")
    if role not in ROLES:
        raise HostsFileError(path, line_no, f"unknown role {role!r} (known: {', '.join(ROLES)})")
    if not count_text:
        return role, 1
    if role in SINGLETON_ROLES:
        raise HostsFileError(path, line_no, f"role {role!r} takes no count")
    if not count_text.isdigit() or int(count_text) < 1:
        raise HostsFileError(path, line_no, f"count of {role!r} must be a positive integer, got {count_text!r}")
    return role, int(count_text)


def _resolve(path: str, line_no: int, name: str, resolve: Resolver) -> str:
    try:
        return resolve(name)
    except OSError:
        raise HostsFileError(path, line_no, f"unknown host {name!r}: it does not resolve; add its address") from None


def _check_whole_file(path: str, hosts: list[Host]) -> None:
    if not hosts:
        raise HostsFileError(path, 0, "no hosts")
    seen_names: dict[str, int] = {}
    seen_singletons: dict[str, int] = {}
    for host in hosts:
        if host.name in seen_names:
            raise HostsFileError(
                path, host.line_no, f"host {host.name!r} already defined on line {seen_names[host.name]}"
            )
        seen_names[host.name] = host.line_no
        for role in SINGLETON_ROLES:
            if role in host.roles:
                if role in seen_singletons:
                    raise HostsFileError(
                        path, host.line_no, f"duplicate role {role!r} (already on line {seen_singletons[role]})"
                    )
                seen_singletons[role] = host.line_no
    for role in ("coordinator", "router"):
        if role not in seen_singletons:
            raise HostsFileError(path, hosts[-1].line_no, f"no host takes the {role!r} role")
    for role in COUNTED_ROLES:
        if not any(role in h.roles for h in hosts):
            raise HostsFileError(path, hosts[-1].line_no, f"no host takes the {role!r} role")
