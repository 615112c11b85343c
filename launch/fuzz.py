"""Hostile input on every socket a live run binds: the proxies, the links served, the PS sockets.

The fuzzer runs beside `Supervisor.run`: once every actor serves, it sends bounded loops of bad
frames (`psrl.reliability.hostile`) to every bound socket at once, connecting the way a peer would
(a PUB to the proxies' inputs, an XSUB to their outputs, a DEALER to ROUTER sockets), and
samples each actor's resident memory before and after. The run must still be going when the last
sender finishes and then publish ``AFTER_VERSIONS`` more versions (it trains on after the flood),
and every link and PS socket's owner must have counted what it was sent; then the fuzzer stops it
as an operator would (``Supervisor.interrupt``), so a run of any length can be fuzzed at any rate.
The event log says whether anyone died or restarted, and each actor's `actor.drops` what it counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from bus.messages import ActorDrops, TrainerProgress
from bus.schema import Event
from launch.supervisor import Supervisor

Drops = Mapping[str, Mapping[str, int]]  # actor -> its last reported drop counts (``actor.drops``)

START_WAIT_S = 900.0
SENDER_TIMEOUT_S = 1800.0
DRAIN_S = 1.0  # for the receiver to work through the last frames before its memory is sampled
AFTER_VERSIONS = 3  # versions the run must publish after the flood before the fuzzer stops it
AFTER_WAIT_S = 600.0
STOP_REASON = "the fuzzing is done and the run trained on after it"


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
    oversized: int = 0  # frames over the run's message limit, each sent on a connection of its own
    cut: int = 0  # of those, the ones whose connection the receiver cut (never reaching its counters)
    seconds: float = 0.0
    rss_growth: int = 0  # the owner's resident memory after the frames (drained) minus before


@dataclass
class BusFuzzer:
    supervisor: Supervisor
    frames_per_target: int
    seed: int = 0
    results: list[TargetResult] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    outlasted: bool = False  # the run was still running when the last sender finished
    published: int = 0  # training steps finished so far (TrainerProgress: each produces a version)
    versions_after: int = 0  # of those, published after the last sender finished
    stopped_run: bool = False  # the fuzzer ended the run once it trained on after the flood
    drops: dict[str, dict[str, int]] = field(default_factory=dict)  # as reported so far

    def start(self) -> threading.Thread:
        self.supervisor.listeners = (*self.supervisor.listeners, self._on_event)
        thread = threading.Thread(target=self._run, name="fuzz", daemon=True)
        thread.start()
        return thread

    def _on_event(self, event: Event[Any]) -> None:
        if isinstance(event.message, TrainerProgress):
            self.published += 1
        elif isinstance(event.message, ActorDrops):
            self.drops[event.envelope.sender] = dict(event.message.counts)

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
            self.results = self._fuzz_all(self.targets())
            if self.outlasted:
                self._train_on_then_stop()
        except Exception as exc:  # reported by the tool; the run itself goes on
            self.error = repr(exc)
        finally:
            self.done.set()

    def _train_on_then_stop(self) -> None:
        sup = self.supervisor
        start = self.published
        deadline = time.monotonic() + AFTER_WAIT_S
        while time.monotonic() < deadline and not sup.is_stopping and not self._caught_up(start):
            time.sleep(0.2)
        self.versions_after = self.published - start
        if not sup.is_stopping:  # caught up, or never will: either way the tool reports what it saw
            self.stopped_run = True
            sup.interrupt(STOP_REASON)

    def _caught_up(self, published_before: int) -> bool:
        """The run trained on after the flood, and every owner counted what it was sent."""
        return self.published - published_before >= AFTER_VERSIONS and uncounted(self.results, self.drops) == 0

    def _wait_serving(self) -> bool:
        deadline = time.monotonic() + START_WAIT_S
        sup = self.supervisor
        while time.monotonic() < deadline and not sup.is_stopping:
            procs = sup.processes
            if len(procs) == len(sup.specs) and all(p.is_ready for p in procs.values()):
                return sup.run_dir.read_state().get("status") == "running"
            time.sleep(0.1)
        return False

    def _fuzz_all(self, targets: list[Target]) -> list[TargetResult]:
        """Every socket at once, each from a sender process of its own (``psrl.reliability.sender``),
        as outside attackers would: senders in this process would compete with the supervisor's
        watch loop, and one after another they could outlast a short run."""
        before = {t.owner: self._rss(t.owner) for t in targets}
        limit = self.supervisor.settings.max_message_bytes
        senders = []
        for target in targets:
            args = [target.address, target.socket_type, self.frames_per_target, self.seed, limit]
            command = [sys.executable, "-m", "psrl.reliability.sender", *map(str, args)]
            senders.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = []
        for target, sender in zip(targets, senders, strict=True):
            out, err = sender.communicate(timeout=SENDER_TIMEOUT_S)
            if sender.returncode != 0:
                raise RuntimeError(f"fuzz sender for {target.owner}:{target.label} failed: {err[-500:]}")
            counts = json.loads(out.strip().splitlines()[-1])
            results.append(
                TargetResult(
                    target, counts["sent"], counts["unsent"], counts["oversized"], counts["cut"], counts["seconds"]
                )
            )
        self.outlasted = self.supervisor.run_dir.read_state().get("status") == "running"
        time.sleep(DRAIN_S)
        for result in results:  # the owner's growth while all of its sockets were fuzzed
            result.rss_growth = self._rss(result.target.owner) - before[result.target.owner]
        return results

    def _rss(self, owner: str) -> int:
        """Resident bytes of the socket's owner (the proxies run in this process)."""
        if owner == "proxy":
            return _rss_bytes(os.getpid())
        process = self.supervisor.processes.get(owner)
        return _rss_bytes(process.pid) if process is not None else 0


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def counted_by(drops: Drops, result: TargetResult) -> int:
    """Drops the socket's owner reported for that socket (the proxies: every subscriber, summed)."""
    owner, label = result.target.owner, result.target.label
    if owner == "proxy":
        marks = (":control:",) if label == "control_in" else (":events:", "event-logger:")
        return sum(n for counts in drops.values() for key, n in counts.items() if any(m in key for m in marks))
    if label in ("push", "pull"):
        prefixes: tuple[str, ...] = (f"{owner}:ps:",)
    else:  # a well-formed message of a kind the link does not carry is counted as unhandled
        prefixes = (f"{owner}:link:", f"{owner}:unhandled")
    return sum(n for key, n in drops.get(owner, {}).items() if key.startswith(prefixes))


def uncounted(results: Sequence[TargetResult], drops: Drops) -> int:
    """Frames sent to links and PS sockets that their owner did not count (the proxies fan out and
    may shed load at their high-water marks, so they are reported, not held to the count). An
    oversized frame whose connection the owner's socket cut never reaches the owner: it is not
    held to the count (the sender saw the cut)."""
    # a shard's two sockets share one counter: what each owner was sent is summed over its sockets
    expected: dict[tuple[str, str], int] = {}
    counted: dict[tuple[str, str], int] = {}
    for result in results:
        if result.target.owner == "proxy":
            continue
        key = (result.target.owner, "ps" if result.target.label in ("push", "pull") else result.target.label)
        expected[key] = expected.get(key, 0) + result.sent - result.cut
        counted[key] = counted_by(drops, result)
    missing = sum(max(0, expected[key] - counted[key]) for key in expected)
    return missing
