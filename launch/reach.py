"""Before a multi-host run starts: can ssh reach every remote host? Its own error on the console if not.

Without this check an unreachable host showed up as "rollout-0 exited while starting (exit code
255)", the reason (ssh's own message: unknown host, refused key, no route) only inside that
actor's log file.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

from launch.hosts import Host, HostsFile

REACH_TIMEOUT_S = 20.0  # ssh's connect and authentication on a slow network, well inside a launch's start-up
_SHOWN_LINES = 3


def ssh_error(stderr: str, code: int) -> str:
    """ssh's own words (its last lines: earlier ones are banners and warnings), or its exit code."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return " / ".join(lines[-_SHOWN_LINES:]) if lines else f"exit code {code}, no message"


def probe(host: Host, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """None when `true` runs on the host over its ssh command, else why not."""
    command = [*host.ssh, "-o", "BatchMode=yes", host.name, "true"]  # the options actors are started with
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return f"{host.ssh[0]} not found on this machine"
    except subprocess.TimeoutExpired:
        return f"no answer over ssh within {timeout_s:.0f} s"
    return None if done.returncode == 0 else ssh_error(done.stderr, done.returncode)


def unreachable(hosts: HostsFile, timeout_s: float = REACH_TIMEOUT_S) -> list[str]:
    """'HOST (hosts file line N): why' for every remote host ssh cannot reach (all probed at once)."""
    remote = [host for host in hosts.hosts if not host.is_local]
    if not remote:
        return []
    with ThreadPoolExecutor(len(remote)) as pool:
        answers = list(pool.map(lambda host: probe(host, timeout_s), remote))
    return [
        f"{host.name} ({hosts.path}:{host.line_no}): {why}" for host, why in zip(remote, answers, strict=True) if why
    ]
