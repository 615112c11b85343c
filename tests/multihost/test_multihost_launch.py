"""`psrl launch --hosts` across three fake hosts (network namespaces with sshd), over CURVE."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from bus.messages import ActorStarted, Hello, Metrics, TrainerProgress, WeightsLoaded
from psrl.rundir import RunDir
from tests.multihost.fakehosts import FakeHosts, can_create_namespaces
from tests.system.launch_helpers import FAKE, logged_events

pytestmark = pytest.mark.multihost

ROLES = ["ps", "rollout", "trainer", "router", "coordinator"]


@pytest.fixture(scope="module")
def fake_hosts(tmp_path_factory):
    reason = can_create_namespaces()
    if reason is not None:
        pytest.skip(f"fake hosts unavailable: {reason}")
    hosts = FakeHosts(tmp_path_factory.mktemp("fakehosts"))
    try:
        yield hosts.up()
    finally:
        hosts.down()


def hosts_file(path: Path, fh: FakeHosts) -> Path:
    ssh = f'ssh="{fh.ssh_command()}"'
    py = f"python={sys.executable}"
    path.write_text(
        f"# launcher in the root namespace, three fake hosts\n"
        f"launcher {fh.launcher_address} coordinator router logger local=true\n"
        f"h1 {fh.address('h1')} rollout ps {ssh} {py}\n"
        f"h2 {fh.address('h2')} rollout trainer {ssh} {py}\n"
        f"h3 {fh.address('h3')} ps {ssh} {py}\n"
    )
    return path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launch_across_hosts_over_curve_and_ctrl_c_cleans_every_host(fake_hosts, tmp_path) -> None:
    hosts = hosts_file(tmp_path / "hosts.txt", fake_hosts)
    cmd = [
        sys.executable,
        "-m",
        "psrl.cli.main",
        "launch",
        "demo",
        "--hosts",
        str(hosts),
        "--root",
        str(tmp_path / "runs"),
        "--name",
        "mh",
        "--quiet",
        *[a for r in ROLES for a in ("--actor-class", f"{r}={FAKE}")],
    ]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = RunDir(tmp_path / "runs" / "mh")
    try:
        _wait_running(run, launcher)
        time.sleep(2.0)  # let the fake actors exchange a few rounds of events
        events = logged_events(run)
    finally:
        launcher.send_signal(signal.SIGINT)
        stopped_at = time.monotonic()
        out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, out
    assert time.monotonic() - stopped_at < 10, out

    hello_hosts = {e.envelope.sender: e.message.host for e in events if isinstance(e.message, Hello)}
    assert {hello_hosts[n] for n in ("rollout-0", "ps-0")} == {"h1"}
    assert {hello_hosts[n] for n in ("rollout-1", "trainer-0")} == {"h2"}
    assert hello_hosts["ps-1"] == "h3"
    # every remote actor received events published on other hosts
    seen = {e.envelope.sender: e.message.values["seen"] for e in events if isinstance(e.message, Metrics)}
    assert all(seen[n] > 0 for n in ("rollout-0", "rollout-1", "trainer-0", "ps-0", "ps-1"))

    bus = json.loads(run.bus.read_text())
    assert bus["events_out"].startswith(f"tcp://{fake_hosts.launcher_address}:")
    assert (run.keys / "server.key_secret").exists()

    pids = [e.message.pid for e in events if isinstance(e.message, Hello)]
    pids += [e.message.pid for e in events if isinstance(e.message, ActorStarted)]
    assert not [p for p in pids if pid_alive(p)]
    for name in fake_hosts.names:
        ps = fake_hosts.run_in(name, "pgrep", "-f", "-m", "actors")
        assert ps.stdout.strip() == "", f"left on {name}: {ps.stdout}"


def test_a_real_run_across_hosts_trains_past_its_first_syncs_over_curve(fake_hosts, tmp_path) -> None:
    """The real actors, not fakes: every instance pulls each version from shards on other hosts through
    CURVE, so the run trains beyond the ``staleness + 1`` steps it can take without a single pull."""
    staleness, steps = 2, 5
    hosts = hosts_file(tmp_path / "hosts.txt", fake_hosts)
    cmd = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--hosts", str(hosts),
           "--root", str(tmp_path / "runs"), "--name", "mh-train", "--quiet",
           f"psrl.staleness={staleness}", f"trainer.total_steps={steps}", "bus.handshake_timeout_s=300"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    events = logged_events(RunDir(tmp_path / "runs" / "mh-train"))
    assert max(e.message.version for e in events if isinstance(e.message, TrainerProgress)) == steps
    loads: dict[str, int] = {}
    for event in events:
        if isinstance(event.message, WeightsLoaded):
            loads[event.message.instance] = max(loads.get(event.message.instance, 0), event.message.version)
    assert sorted(loads) == ["rollout-0", "rollout-1"] and min(loads.values()) >= staleness, loads


def _wait_running(run: RunDir, launcher: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise AssertionError(f"launcher exited early: {launcher.stdout.read() if launcher.stdout else ''}")
        if run.state.exists() and run.read_state().get("status") == "running":
            return
        time.sleep(0.2)
    raise AssertionError("run did not reach running")


def test_a_client_without_the_key_hears_nothing(fake_hosts, tmp_path) -> None:
    """The run's proxy speaks CURVE only: a plain subscriber on another host gets no events."""
    from bus import BusProxy, Publisher
    from bus.addresses import plan_addresses
    from bus.security import generate_keys, load_keys
    from bus.sockets import SocketOptions

    generate_keys(tmp_path / "keys")
    keys = load_keys(tmp_path / "keys")
    ctx = zmq.Context()
    proxy = BusProxy(
        plan_addresses(tmp_path, "tcp", fake_hosts.launcher_address, str(tmp_path / "keys")),
        SocketOptions(curve=keys),
        ctx,
    )
    addresses = proxy.start()
    try:
        probe = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                fake_hosts.namespace("h2"),
                sys.executable,
                "-c",
                "import sys, zmq; s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b'');"
                f"s.connect('{addresses.events_out}'); print('got' if s.poll(3000) else 'nothing')",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        publisher = Publisher(ctx, addresses, "probe", options=SocketOptions(curve=keys))
        for i in range(30):
            publisher.publish(Metrics(i, {"x": 1.0}))
            time.sleep(0.1)
        out, _ = probe.communicate(timeout=20)
        publisher.close()
        assert out.strip() == "nothing"
    finally:
        proxy.stop()
        ctx.destroy(linger=0)
