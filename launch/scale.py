"""Elastic rollout in the supervisor: instances added and removed while the run trains.

A ``ctl.scale`` request (`psrl scale`, `psrl.scale`, the chaos harness) is decided by
``psrl.coordination.scaling.decide_scale`` against the running instances and the placement's room
(``launch.scale_placement``), and the decision, or the refusal, is published as ``sup.scale`` with
what it was decided from (``psrl replay --check scale`` re-makes it). A refused request changes
nothing; a request seen twice (the asker re-sends until it hears the answer) is answered again,
not applied again.

* Added instances start on the placement's host as any actor does, join the router by their first
  status report and load the parameter server's committed version before they serve.
* Removed instances *retire*: the router stops routing to them and asks them to hand their requests
  back (each continues on another instance from its exact tokens), sessions move their pin, the
  coordinator stops syncing them. When the router reports one drained (``router.drained``), or
  after ``topology.drain_timeout_s``, it is shut down; its exit is not restarted.
* With ``topology.restart_rollout=false`` an instance that dies is lost for good: the supervisor
  publishes the smaller set (``sup.scale`` with an empty token), the router continues the lost
  instance's requests elsewhere, and the run goes on while one instance is left.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bus.messages import InstanceDrained, ScaleDecided, ScaleRequest, Shutdown
from bus.schema import Message
from launch.plan import ActorSpec
from launch.process import ActorProcess
from launch.scale_placement import RolloutPlacement
from psrl.coordination.scaling import NO_TARGET, ScaleAsk, decide_scale, instance_index
from psrl.log import get_logger

ROLE = "rollout"
KILL_AFTER_S = 10.0  # a retiring instance still alive this long after its Shutdown is killed
MAX_ANSWERS = 256  # answers kept for requests re-sent by their asker


@dataclass
class _Retiring:
    deadline: float  # shut down by now, drained or not
    shutdown_at: float | None = None


@dataclass
class ScaleController:
    """The rollout instance set of one launch; the supervisor calls it from its watch loop."""

    placement: RolloutPlacement
    publish: Callable[[Message], object]
    start: Callable[[ActorSpec], ActorProcess]  # starts a new actor (its first incarnation of the launch)
    processes: dict[str, ActorProcess]
    drain_timeout_s: float
    restart_rollout: bool = True
    next_index: int = 0
    retiring: dict[str, _Retiring] = field(default_factory=dict)
    joining: set[str] = field(default_factory=set)  # added by a request, not serving yet
    answers: dict[str, ScaleDecided] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log = get_logger("psrl.launch.scale")
        self.next_index = max([instance_index(n) + 1 for n in self.processes if _is_rollout(n)] + [self.next_index])

    @property
    def active(self) -> list[str]:
        """The instances that serve (running, not retiring), in index order."""
        names = [n for n in self.processes if _is_rollout(n) and n not in self.retiring]
        return sorted(names, key=instance_index)

    # ------------------------------------------------------------------ requests

    def on_request(self, request: ScaleRequest, *, refuse: str = "") -> ScaleDecided:
        """Decide ``request`` (or refuse it with ``refuse``, the supervisor's own reason), publish the
        answer and act on it."""
        known = self.answers.get(request.token)
        if known is not None:
            self.publish(known)  # the asker did not hear it: the same answer again, nothing done twice
            return known
        ask = ScaleAsk(request.role, request.delta, request.target)
        # a retiring instance holds its place (its GPU, its core) until it has exited
        before, limit = self.active, max(0, self.placement.limit() - len(self.retiring))
        plan = decide_scale(ask, before, limit, self.next_index)
        error = refuse or plan.error
        decided = ScaleDecided(
            token=request.token, role=request.role, delta=request.delta, target=request.target, before=before,
            limit=limit, next_index=self.next_index, added=[] if error else list(plan.added),
            removed=[] if error else list(plan.removed), error=error, reason=request.reason,
        )  # fmt: skip
        self.answers[request.token] = decided
        while len(self.answers) > MAX_ANSWERS:
            del self.answers[next(iter(self.answers))]
        self.publish(decided)
        if error:
            self.log.warning("scale request refused", ask=ask.describe(), error=error)
            return decided
        self.log.info("scaling", ask=ask.describe(), added=plan.added, removed=plan.removed, before=before)
        self._apply(decided)
        return decided

    def _apply(self, decided: ScaleDecided) -> None:
        now = time.monotonic()
        for name in decided.removed:
            self.retiring[name] = _Retiring(now + self.drain_timeout_s)
        for name in decided.added:
            index = instance_index(name)
            self.next_index = max(self.next_index, index + 1)
            self.joining.add(name)
            self.start(ActorSpec(name, ROLE, index, self.placement.host_for(index, self.active)))

    # ------------------------------------------------------------------ drain

    def on_drained(self, drained: InstanceDrained) -> None:
        retiring = self.retiring.get(drained.instance)
        if retiring is not None and retiring.shutdown_at is None:
            self.log.info("instance drained", instance=drained.instance, moved=drained.num_moved)
            self._shut_down(drained.instance, retiring, "drained: its requests continue on the other instances")

    def tick(self, now: float) -> None:
        """Retiring instances past their drain timeout are shut down; past the kill grace, killed."""
        for name, retiring in list(self.retiring.items()):
            process = self.processes.get(name)
            if process is None:
                continue
            if retiring.shutdown_at is None and now >= retiring.deadline:
                self.log.warning("instance not drained in time; shut down", instance=name)
                self._shut_down(name, retiring, "drain timeout: the router continues what it still held")
            elif retiring.shutdown_at is not None and now - retiring.shutdown_at > KILL_AFTER_S:
                process.signal(signal.SIGKILL)

    def _shut_down(self, name: str, retiring: _Retiring, reason: str) -> None:
        retiring.shutdown_at = time.monotonic()
        self.publish(Shutdown(targets=[name], reason=f"scaled down; {reason}"))

    # ------------------------------------------------------------------ deaths

    def takes_death(self, name: str) -> bool:
        """A retiring instance's exit ends it (no restart); True when this controller took it."""
        if self.retiring.pop(name, None) is None:
            return False
        self.processes.pop(name, None)
        return True

    def joined(self, name: str) -> None:
        """An added instance reported ready: from now on it dies and restarts like any instance."""
        self.joining.discard(name)

    def loses_for_good(self, name: str, reason: str) -> ScaleDecided | None:
        """A dead instance that leaves the set (None: restart it): any, with ``topology.restart_rollout=false``;
        and an added one that never served (a start that fails would fail again: the run goes on as before)."""
        if not _is_rollout(name) or name not in self.processes:
            return None
        if name in self.joining:
            why = f"{name} failed to start ({reason}): not restarted, the run continues as before it was added"
        elif not self.restart_rollout:
            why = f"{name} lost ({reason}); topology.restart_rollout=false: not restarted"
        else:
            return None
        self.joining.discard(name)
        before = self.active
        self.processes.pop(name, None)
        decided = ScaleDecided(
            token="", role=ROLE, delta=-1, target=NO_TARGET, before=before, limit=self.placement.limit(),
            next_index=self.next_index, removed=[name], reason=why,
        )  # fmt: skip
        self.publish(decided)
        self.log.warning("instance lost for good; the run continues on the others", instance=name,
                         left=self.active)  # fmt: skip
        return decided


def _is_rollout(name: str) -> bool:
    return name.startswith(f"{ROLE}-")
