"""Fault plans for the chaos harness, and how long each fault took to heal (pure, seeded).

A plan is drawn from a seed, so a failing case is re-run exactly: the same targets, the same
kinds and the same gaps between faults. Recovery is read back from the event log: a fault is
healed when its actor's next incarnation reports Ready (it serves again). An env worker is no
actor: its faults target ``<session actor>/env`` (one of that actor's env worker processes) and
heal when the pool's replacement of the killed or hung process reports ready (``EnvWorkerReady``).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bus.messages import ActorExited, ActorStarted, EnvWorkerReady, Ready
from bus.schema import Event

KILL, STOP = "kill", "stop"  # SIGKILL (a crash), SIGSTOP (a hung process: only heartbeats reveal it)
ENV_WORKERS = "/env"  # a target ``session/env``: an env worker process of that session scheduler


def is_env_target(target: str) -> bool:
    return target.endswith(ENV_WORKERS)


# Moments of a weight sync a fault can be timed against: a version published by the PS, the
# coordinator's sync command, an instance's load. A router killed just after a publish is down while
# the instances load the new version and the coordinator's requests queue for it.
PUBLISH, SYNC, LOAD = "publish", "sync", "load"
ANCHORS = (PUBLISH, SYNC, LOAD)
MAX_ANCHOR_DELAY_S = 0.5  # an anchored fault lands within this long of its moment


@dataclass(frozen=True)
class Fault:
    after_s: float  # wait this long after the previous fault healed (or after the run started)
    target: str  # actor name
    kind: str
    anchor: str = ""  # one of ANCHORS: after the gap, wait for the next such moment, then ``delay_s``
    delay_s: float = 0.0

    def describe(self) -> str:
        when = f"{self.anchor}+{self.delay_s:g}s" if self.anchor else f"{self.after_s:g}s"
        return f"{self.target}:{self.kind}@{when}"


@dataclass(frozen=True)
class InjectedFault:
    target: str
    kind: str
    wall_s: float  # when the signal was sent
    incarnation: int  # the incarnation it hit
    pid: int = 0  # the process it hit (an env worker's, which has no incarnation)
    anchor: str = ""  # the sync moment it was timed against (ANCHORS), if any


def plan_faults(
    seed: int,
    targets: Sequence[str],
    num_faults: int,
    *,
    mean_gap_s: float,
    stop_share: float = 0.25,
    anchored_share: float = 0.0,
) -> list[Fault]:
    """``num_faults`` faults on random ``targets``, exponential gaps of mean ``mean_gap_s``; a share
    ``anchored_share`` of them is timed against a sync moment (``ANCHORS``). A hung env worker is found
    by its silent heartbeat, like a hung actor, and replaced; its step runs again."""
    if not targets:
        raise ValueError("a fault plan needs at least one target actor")
    rng = random.Random(seed)
    plan = []
    for _ in range(num_faults):
        kind = STOP if rng.random() < stop_share else KILL
        gap = round(rng.expovariate(1.0 / mean_gap_s), 3)  # drawn before the target: seeds keep their plans
        target = rng.choice(list(targets))
        fault = Fault(gap, target, kind)
        if anchored_share > 0 and rng.random() < anchored_share:  # no extra draws otherwise: same plans
            anchor, delay = rng.choice(ANCHORS), round(rng.uniform(0.0, MAX_ANCHOR_DELAY_S), 3)
            fault = Fault(gap, target, kind, anchor, delay)
        plan.append(fault)
    return plan


def parse_plan(text: str, targets: Sequence[str]) -> list[Fault]:
    """An explicit plan, faults in order: ``TARGET[:kill|stop]@SECONDS`` (after the previous fault) or
    ``TARGET[:kind]@ANCHOR[+SECONDS]`` (after the next sync moment), comma separated. For example
    ``rollout-0@4,ps-1@5,router@publish+0.1``: the multi-role plan of a night on a cluster."""
    plan = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        who, _, when = item.partition("@")
        target, _, kind = who.partition(":")
        kind = kind or KILL
        if target not in targets or kind not in (KILL, STOP) or not when:
            raise ValueError(f"fault {item!r}: want TARGET[:kill|stop]@SECONDS or @ANCHOR[+SECONDS], "
                             f"TARGET one of {sorted(targets)}, ANCHOR one of {list(ANCHORS)}")  # fmt: skip
        anchor, _, delay = when.partition("+")
        if anchor in ANCHORS:
            plan.append(Fault(0.0, target, kind, anchor, float(delay or 0.0)))
        else:
            plan.append(Fault(float(when), target, kind))
    return plan


@dataclass(frozen=True)
class Recovery:
    fault: InjectedFault
    seconds: float | None  # signal -> the replacement's Ready; None: never served again
    detect_s: float | None  # signal -> the supervisor saw the death (heartbeats, for a hang)
    warm: bool = False  # the replacement was a warm spare (sup.started warm), not a new process


def recoveries(faults: Iterable[InjectedFault], events: Iterable[Event[Any]]) -> list[Recovery]:
    """For each fault, the time from the signal to its actor's next incarnation reporting Ready."""
    readies: dict[str, list[tuple[float, int]]] = {}
    exits: dict[str, list[tuple[float, int]]] = {}
    warm_starts: set[tuple[str, int]] = set()
    replaced: dict[int, float] = {}  # env worker pid -> when its replacement reported ready
    for event in events:
        msg, env = event.message, event.envelope
        if isinstance(msg, EnvWorkerReady) and msg.replaced_pid:
            replaced.setdefault(msg.replaced_pid, env.wall_ns / 1e9)
        elif isinstance(msg, Ready):
            readies.setdefault(env.sender, []).append((env.wall_ns / 1e9, env.incarnation))
        elif isinstance(msg, ActorExited):
            exits.setdefault(msg.actor, []).append((env.wall_ns / 1e9, msg.incarnation))
        elif isinstance(msg, ActorStarted) and msg.warm:
            warm_starts.add((msg.actor, msg.incarnation))
    return [
        _env_recovery(fault, replaced)
        if is_env_target(fault.target)
        else Recovery(
            fault,
            _first_after(readies.get(fault.target, []), fault, later_incarnation=True),
            _first_after(exits.get(fault.target, []), fault, later_incarnation=False),
            (fault.target, fault.incarnation + 1) in warm_starts,  # the replacement is the next incarnation
        )
        for fault in faults
    ]


def _env_recovery(fault: InjectedFault, replaced: dict[int, float]) -> Recovery:
    """An env worker's fault heals when its replacement reports ready (the pool saw the death then too)."""
    ready = replaced.get(fault.pid)
    seconds = round(ready - fault.wall_s, 3) if ready is not None and ready >= fault.wall_s else None
    return Recovery(fault, seconds, None)


def _first_after(stamps: list[tuple[float, int]], fault: InjectedFault, *, later_incarnation: bool) -> float | None:
    """Seconds from the fault to the first stamp of the incarnation it hit (or of a later one)."""
    later = [
        t
        for t, incarnation in stamps
        if t >= fault.wall_s
        and (incarnation > fault.incarnation if later_incarnation else incarnation == fault.incarnation)
    ]
    return round(min(later) - fault.wall_s, 3) if later else None


def cold_starts(events: Iterable[Event[Any]]) -> dict[str, float]:
    """Seconds from the supervisor starting each actor at launch to its Ready: the same run's baseline
    for a restart (which pays the same process start, imports and setup)."""
    started: dict[str, float] = {}
    ready: dict[str, float] = {}
    for event in events:
        msg, env = event.message, event.envelope
        if isinstance(msg, ActorStarted) and msg.actor not in started:
            started[msg.actor] = env.wall_ns / 1e9
        elif isinstance(msg, Ready) and env.sender not in ready:
            ready[env.sender] = env.wall_ns / 1e9
    return {name: round(ready[name] - t, 3) for name, t in started.items() if name in ready}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    if len(values) == 1:
        return float(values[0])
    cuts = statistics.quantiles(sorted(values), n=100, method="inclusive")
    return float(cuts[min(98, max(0, round(q * 100) - 1))])
