"""Fault injection into a live run: signals actors of a supervised run by a seeded plan.

The injector runs beside `Supervisor.run` (which needs the main thread for its signal
handlers). Each fault waits for its gap, then for the target to be serving (a fault on an actor
that is still restarting would test the restart budget, not recovery), then for a warm spare to
be ready (so a replacement's start is warm whenever the run keeps spares: what is measured is
recovery with spares, not a race with the previous spare's imports; after SPARE_WAIT_S it goes
ahead; with more than one spare the next fault need not wait for the used one's successor), then
sends SIGKILL (a crash) or SIGSTOP (a hang, which only missed heartbeats reveal), and waits until
the supervisor has launched the replacement, so faults come one at a time (a second one inside a
hang's detection window would take its spare). The supervisor does the rest; the event log says
afterwards whether every promise held (`psrl.reliability`).

A target ``<session actor>/env`` is one of that actor's env worker processes (``num_env_workers``
of them, found under /proc): the fault kills or stops the next one in turn (the pool finds a stopped
one by its silent heartbeat), and the next fault waits until the pool's replacement reported ready
(``session.env_worker`` naming the faulted pid; ``on_event`` is the supervisor listener that sees it).

Elastic events (``SCALE_UP`` / ``SCALE_DOWN``, target ``rollout``) mix with the faults: each asks the
run's supervisor over the bus for one instance more or fewer, exactly as `psrl scale` does, and the next
event waits until the new instance serves or the retired one has stopped. A request the run refuses (no
room, the last instance) is counted, not an error. With elastic events a fault aimed at a rollout
instance that was retired meanwhile hits a serving one instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bus.messages import EnvWorkerReady, SyncCommand, WeightsLoaded, WeightsPublished
from bus.schema import Event
from launch.env_workers import env_workers
from launch.supervisor import Supervisor
from psrl.coordination.scaling import ScaleAsk
from psrl.reliability.faults import ENV_WORKERS, KILL, LOAD, PUBLISH, SYNC, Fault, InjectedFault, is_env_target
from psrl.scale_request import ScaleError, scale

SCALE_UP, SCALE_DOWN = "scale_up", "scale_down"  # elastic events: one rollout instance more / fewer
SCALE_TIMEOUT_S = 60.0  # for the supervisor's answer to a scale request
SETTLE_WAIT_S = 240.0  # for an added instance to serve, or a retired one to stop

READY_WAIT_S = 240.0  # how long a fault waits for its target to serve before it is skipped (a loaded machine)
SPARE_WAIT_S = 120.0  # how long it waits for the warm spares to be ready before it goes ahead anyway
MOMENTS = {WeightsPublished.KIND: PUBLISH, SyncCommand.KIND: SYNC, WeightsLoaded.KIND: LOAD}
MOMENT_WAIT_S = 120.0  # how long an anchored fault waits for its sync moment before it is skipped
REPLACE_WAIT_S = 60.0  # how long the next fault waits for the previous one's replacement to be launched
POLL_S = 0.05


@dataclass
class FaultInjector:
    supervisor: Supervisor
    plan: list[Fault]
    injected: list[InjectedFault] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    num_env_workers: int = 0  # env.num_workers of the run (env worker targets)
    replaced_pids: set[int] = field(default_factory=set)  # env workers whose replacement reported ready
    moments: dict[str, int] = field(default_factory=lambda: {PUBLISH: 0, SYNC: 0, LOAD: 0})  # seen so far
    scaled: list[tuple[str, str]] = field(default_factory=list)  # (event kind, instance added or removed)
    refused: list[str] = field(default_factory=list)  # scale requests the run refused, with why

    def on_event(self, event: Event[Any]) -> None:
        """A supervisor listener (its thread): env worker replacements, and the sync moments faults are
        timed against."""
        msg = event.message
        if isinstance(msg, EnvWorkerReady) and msg.replaced_pid:
            self.replaced_pids.add(msg.replaced_pid)
        moment = MOMENTS.get(msg.KIND)
        if moment is not None:
            self.moments[moment] += 1

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        if not self._until(lambda: self.supervisor.run_dir.read_state().get("status") == "running", 600.0):
            return
        for planned in self.plan:
            self._until(lambda: False, planned.after_s)  # the gap
            if self.supervisor.is_stopping:
                return
            if planned.kind in (SCALE_UP, SCALE_DOWN):
                self._scale(planned.kind)
            elif not self._fault(self._aimed(planned)):
                return

    def _fault(self, fault: Fault) -> bool:
        """Inject one fault when its target serves; False once the run stops."""
        if not self._until(functools.partial(self._serving, fault.target), READY_WAIT_S):
            if not self.supervisor.is_stopping:
                self.skipped.append(f"{fault.target}: not serving after {READY_WAIT_S:.0f} s")
            return not self.supervisor.is_stopping
        self._until(lambda: self.supervisor.spare_ready, SPARE_WAIT_S)
        if self.supervisor.is_stopping:
            return False
        if self._at_moment(fault) and self._inject(fault):
            # one fault at a time: the next waits until this one's replacement is launched (a hang
            # is seen only after the missed heartbeats), so it cannot take the spare first
            self._until(functools.partial(self._replaced, self.injected[-1]), REPLACE_WAIT_S)
        return True

    def _scale(self, kind: str) -> None:
        """One instance more or fewer, asked over the bus; then until the set has settled."""
        ask = ScaleAsk("rollout", delta=1 if kind == SCALE_UP else -1)
        try:
            result = scale(self.supervisor.run_dir.path, ask, timeout_s=SCALE_TIMEOUT_S, reason="chaos")
        except ScaleError as error:
            if not self.supervisor.is_stopping:
                self.refused.append(f"{kind}: {error}")
            return
        for name in result.added:
            self.scaled.append((kind, name))
            self._until(functools.partial(self._serving, name), SETTLE_WAIT_S)
        for name in result.removed:
            self.scaled.append((kind, name))
            self._until(lambda name=name: name not in self.supervisor.processes, SETTLE_WAIT_S)  # type: ignore[misc]

    def _aimed(self, fault: Fault) -> Fault:
        """A fault on a rollout instance retired since the plan was drawn hits a serving one instead."""
        scaler = self.supervisor.scaler
        if scaler is None or not fault.target.startswith("rollout-") or fault.target in scaler.active:
            return fault
        active = scaler.active
        if not active:
            return fault
        target = active[len(self.injected) % len(active)]
        return Fault(fault.after_s, target, fault.kind, fault.anchor, fault.delay_s)

    def _at_moment(self, fault: Fault) -> bool:
        """An anchored fault waits for the next moment of its kind, then its delay; False when none came
        (skipped) or the run stops meanwhile."""
        if not fault.anchor:
            return True
        seen = self.moments[fault.anchor]
        if not self._until(lambda: self.moments[fault.anchor] > seen, MOMENT_WAIT_S):
            if not self.supervisor.is_stopping:
                self.skipped.append(f"{fault.describe()}: no {fault.anchor} within {MOMENT_WAIT_S:.0f} s")
            return False
        self._until(lambda: False, fault.delay_s)
        return not self.supervisor.is_stopping and self._serving(fault.target)

    def _replaced(self, injected: InjectedFault) -> bool:
        process = self.supervisor.processes.get(_actor(injected.target))
        if process is None or process.incarnation != injected.incarnation:
            return process is not None
        return is_env_target(injected.target) and injected.pid in self.replaced_pids

    def _serving(self, name: str) -> bool:
        process = self.supervisor.processes.get(_actor(name))
        if process is None or not process.is_ready or process.poll() is not None:
            return False
        return not is_env_target(name) or len(env_workers(process.pid)) >= self.num_env_workers

    def _inject(self, fault: Fault) -> bool:
        process = self.supervisor.processes[_actor(fault.target)]
        signum = signal.SIGKILL if fault.kind == KILL else signal.SIGSTOP
        pid = process.pid
        if is_env_target(fault.target):
            workers = env_workers(process.pid)
            if not workers:
                self.skipped.append(f"{fault.target}: no env worker to fault")
                return False
            pid = workers[sum(is_env_target(f.target) for f in self.injected) % len(workers)]
        self.injected.append(
            InjectedFault(fault.target, fault.kind, time.time(), process.incarnation, pid, fault.anchor)
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        return True

    def _until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``condition()`` came true within ``timeout_s`` (False at once when the run stops)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.supervisor.is_stopping:
            if condition():
                return True
            time.sleep(POLL_S)
        return False


def _actor(target: str) -> str:
    """The actor a target names: an env worker target names its session scheduler."""
    return target.removesuffix(ENV_WORKERS)


def mix_scale_events(seed: int, faults: list[Fault], share: float, mean_gap_s: float) -> list[Fault]:
    """``faults`` with elastic events drawn in between: before each fault, with probability ``share``, one
    instance more or fewer (an even draw); at least one of each when ``share`` > 0. Seeded apart from the
    faults, so a seed keeps its faults."""
    if share <= 0:
        return list(faults)
    rng = random.Random(seed * 7919 + 17)
    mixed: list[Fault] = []
    for fault in faults:
        if rng.random() < share:
            kind = SCALE_UP if rng.random() < 0.5 else SCALE_DOWN
            mixed.append(Fault(round(rng.expovariate(1.0 / mean_gap_s), 3), "rollout", kind))
        mixed.append(fault)
    for kind in (SCALE_UP, SCALE_DOWN):
        if not any(f.kind == kind for f in mixed):
            mixed.append(Fault(round(rng.expovariate(1.0 / mean_gap_s), 3), "rollout", kind))
    return mixed
