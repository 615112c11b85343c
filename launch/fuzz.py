"""Hostile input on every socket a live run binds: the proxies, the links served, the PS sockets.

The fuzzer runs beside `Supervisor.run`: once every actor serves, it sends bounded loops of bad
frames (`psrl.reliability.hostile`) to each bound socket in turn, connecting the way a peer would
(a PUB to the proxies' inputs, an XSUB to their outputs, a DEALER to ROUTER sockets), and
samples each actor's resident memory before and after. The run then goes on to finish: the
event log says whether anyone died or restarted, and each actor's `actor.drops` what it counted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from launch.supervisor import Supervisor
from psrl.reliability.hostile import HostileFrames

SEND_TIMEOUT_MS = 2000  # a peer that stops reading blocks a DEALER: give up on that frame instead
START_WAIT_S = 900.0


@dataclass(frozen=True)
class Target:
    owner: str  # the actor (or "proxy") that binds the socket
    label: str
    address: str
    socket_type: int


@dataclass
class TargetResult:
    target: Target
    sent: int = 0
    unsent: int = 0  # frames the socket would not take within SEND_TIMEOUT_MS (backpressure)
    seconds: float = 0.0


@dataclass
class BusFuzzer:
    supervisor: Supervisor
    frames_per_target: int
    seed: int = 0
    results: list[TargetResult] = field(default_factory=list)
    rss_before: dict[str, int] = field(default_factory=dict)
    rss_after: dict[str, int] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="fuzz", daemon=True)
        thread.start()
        return thread

    def targets(self) -> list[Target]:
        """Every socket the run binds: the point-to-point ones first (their owners count each frame),
        then the proxies (which fan out to every subscriber)."""
        sup = self.supervisor
        found = []
        for spec in sup.specs:
            if spec.role in ("router", "trainer"):
                found.append(Target(spec.name, "link", sup.endpoints[spec.name], zmq.DEALER))
            elif spec.role == "ps":
                found.append(Target(spec.name, "push", sup.endpoints[spec.name], zmq.DEALER))
                found.append(Target(spec.name, "pull", sup.endpoints[f"{spec.name}.1"], zmq.DEALER))
        return [
            *found,
            Target("proxy", "events_in", sup.addresses.events_in, zmq.PUB),
            Target("proxy", "control_in", sup.addresses.control_in, zmq.PUB),
            Target("proxy", "events_out", sup.addresses.events_out, zmq.XSUB),
        ]

    def _run(self) -> None:
        try:
            if not self._wait_serving():
                self.error = "the run never had every actor serving"
                return
            self.rss_before = self._rss()
            frames = HostileFrames(self.seed, max_message_bytes=self.supervisor.settings.max_message_bytes)
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
            try:
                for target in self.targets():
                    if self.supervisor.is_stopping:
                        break
                    self.results.append(self._fuzz(ctx, target, frames))
            finally:
                ctx.destroy(linger=0)
            time.sleep(2.0)  # let the receivers drain before sampling memory
            self.rss_after = self._rss()
        except Exception as exc:  # reported by the tool; the run itself goes on
            self.error = repr(exc)
        finally:
            self.done.set()

    def _wait_serving(self) -> bool:
        deadline = time.monotonic() + START_WAIT_S
        sup = self.supervisor
        while time.monotonic() < deadline and not sup.is_stopping:
            procs = sup.processes
            if len(procs) == len(sup.specs) and all(p.is_ready for p in procs.values()):
                return sup.run_dir.read_state().get("status") == "running"
            time.sleep(0.1)
        return False

    def _fuzz(self, ctx: zmq.Context[zmq.Socket[bytes]], target: Target, frames: HostileFrames) -> TargetResult:
        result = TargetResult(target)
        sock = ctx.socket(target.socket_type)
        sock.sndtimeo = SEND_TIMEOUT_MS
        sock.linger = 0
        sock.connect(target.address)
        time.sleep(0.2)  # the connection (and, for a PUB, the proxy's subscriptions) comes up
        started = time.monotonic()
        for message in frames.frames(self.frames_per_target):
            try:
                sock.send_multipart(message)
                result.sent += 1
            except zmq.Again:
                result.unsent += 1
            if self.supervisor.is_stopping:
                break
        result.seconds = time.monotonic() - started
        sock.close(linger=0)
        return result

    def _rss(self) -> dict[str, int]:
        return {name: _rss_bytes(p.pid) for name, p in self.supervisor.processes.items() if p.poll() is None}


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
