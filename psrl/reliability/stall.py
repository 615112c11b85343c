"""No silent stall: who holds a run's work when training stops moving, and what to do about it.

The supervisor hears every trainer step, the router's status (its queue, the instance versions it
routes by, the ledger's next buffer), each instance's status report, every publication and load of a
version and every failed pull. When no step comes for ``run.stall_timeout_s`` while work is waiting,
``StallWatch`` names the actors that hold the work and what they wait for (``diagnose``, first rule
that applies):

    trainer      the ledger handed it a buffer beyond its version and it has not trained it
    instances    their weight pulls keep failing (a refused handshake, an unreachable shard)
    router       requests queue, but the versions it routes by are older than the instances report
                 (it missed their loads): no instance is eligible in its view
    instances    requests queue for a buffer no instance is fresh enough for, though the PS has
                 published a version that is: they have not synced
    instances    requests run on them and none finishes
    router       requests queue, none servable, none running: its ledger's buffers are reserved for
                 groups that are not in flight
    router       it has not reported its status for the whole time
    coordinator  nothing queues or runs, yet the trainer waits: no requests were sent

Before the run's first step the watch waits twice as long (model loads and the first generation
come first), and after its last step it no longer watches (a final evaluation may follow).

The policy (``StallPolicy``): restart the holders once; if the run still makes no step for another
``stall_timeout_s``, end it (the trainer checkpoints on the way out, so ``psrl launch ... --name``
resumes it). A step ends the episode: a later stall gets its own restart.

Pure: observations in, a diagnosis out; the supervisor wires it, tests drive it with plain values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RESTART, END = "restart", "end"


@dataclass(frozen=True)
class RouterView:
    num_queued: int
    num_inflight: int
    versions: tuple[int, ...]  # the instance versions the router routes by
    num_servable: int  # queued requests some known version could take
    next_buffer: int
    at: float


@dataclass(frozen=True)
class InstanceProgress:
    version: int
    num_running: int
    at: float


@dataclass(frozen=True)
class Diagnosis:
    holders: tuple[str, ...]
    waits_for: str
    facts: dict[str, str]


@dataclass
class StallFacts:
    """What the supervisor heard, as of now."""

    staleness: int
    trained_version: int = 0
    published_version: int = 0
    router: RouterView | None = None
    instances: dict[str, InstanceProgress] = field(default_factory=dict)
    pull_failures: dict[str, str] = field(default_factory=dict)  # actor -> latest failure since its last load

    def as_text(self) -> dict[str, str]:
        facts = {
            "trained_version": str(self.trained_version),
            "published_version": str(self.published_version),
            "staleness": str(self.staleness),
            "instance_versions": ", ".join(f"{n}={v.version}" for n, v in sorted(self.instances.items())),
        }
        if self.router is not None:
            r = self.router
            facts |= {
                "router_queued": str(r.num_queued),
                "router_inflight": str(r.num_inflight),
                "router_versions": str(list(r.versions)),
                "router_servable": str(r.num_servable),
                "ledger_next_buffer": str(r.next_buffer),
            }
        return facts | {f"pull_failure:{n}": reason for n, reason in sorted(self.pull_failures.items())}


def diagnose(facts: StallFacts, now: float, timeout_s: float) -> Diagnosis:
    """Who holds the work, by the rules in the module's docstring."""
    text = facts.as_text()
    router, instances = facts.router, facts.instances
    if router is not None and router.next_buffer > facts.trained_version:
        return Diagnosis(("trainer-0",), f"training buffer {facts.trained_version}, handed over and not trained", text)
    if facts.pull_failures:
        names = tuple(sorted(facts.pull_failures))
        reason = facts.pull_failures[names[0]]
        return Diagnosis(names, f"weights: pulls from the parameter server keep failing ({reason})", text)
    if router is None or now - router.at > timeout_s:
        return Diagnosis(("router",), "nothing: it has sent no status while the run waited", text)
    reported = [v.version for v in instances.values()]
    needed = router.next_buffer - facts.staleness
    if router.num_queued and router.num_servable == 0:
        if reported and max(router.versions, default=-1) < min(reported):
            return Diagnosis(("router",), _stale_view(router, reported), text)
        behind = tuple(sorted(n for n, v in instances.items() if v.version < needed))
        if behind and facts.published_version >= needed:
            return Diagnosis(behind, f"a sync: requests need version >= {needed}, published "
                             f"{facts.published_version}, and they hold {sorted(reported)}", text)  # fmt: skip
    running = tuple(sorted(n for n, v in instances.items() if v.num_running > 0))
    if router.num_inflight and running:
        return Diagnosis(running, f"their {router.num_inflight} running requests to finish", text)
    if router.num_queued and router.num_servable == 0 and not router.num_inflight:
        return Diagnosis(("router",), _no_room(router), text)
    if router.num_queued:
        return Diagnosis(("router",), f"an instance for {router.num_queued} queued requests", text)
    return Diagnosis(("coordinator",), f"requests for buffer {router.next_buffer}: none queued or running", text)


def _no_room(router: RouterView) -> str:
    return (
        f"room in its staleness ledger: {router.num_queued} requests queued, none servable at versions "
        f"{list(router.versions)} and none running, so buffers from {router.next_buffer} on hold reservations "
        "of groups that are not in flight"
    )


def _stale_view(router: RouterView, reported: list[int]) -> str:
    return (
        f"instance versions it never heard of: {router.num_queued} requests queued, routed by versions "
        f"{list(router.versions)} while the instances report {sorted(reported)}"
    )


@dataclass
class StallPolicy:
    """Restart the holders once per stall episode, then end the run."""

    restarted: bool = False

    def action(self) -> str:
        if self.restarted:
            return END
        self.restarted = True
        return RESTART

    def progressed(self) -> None:
        self.restarted = False


FIRST_STEP_FACTOR = 2.0


@dataclass
class StallWatch:
    timeout_s: float
    facts: StallFacts
    last_step_at: float
    total_steps: int = 0  # the run's last version (0: unknown, watch forever)
    policy: StallPolicy = field(default_factory=StallPolicy)
    next_check_at: float = 0.0

    def __post_init__(self) -> None:
        self.next_check_at = self.last_step_at + FIRST_STEP_FACTOR * self.timeout_s

    def trained(self, version: int, now: float) -> None:
        self.facts.trained_version = max(self.facts.trained_version, version)
        self.last_step_at, self.next_check_at = now, now + self.timeout_s
        self.policy.progressed()

    def published(self, version: int) -> None:
        self.facts.published_version = max(self.facts.published_version, version)

    def loaded(self, actor: str) -> None:
        self.facts.pull_failures.pop(actor, None)

    def pull_failed(self, actor: str, reason: str) -> None:
        self.facts.pull_failures[actor] = reason

    def check(self, now: float) -> tuple[Diagnosis, str, float] | None:
        """(diagnosis, action, seconds without a step) each ``timeout_s`` that passes without a step."""
        if self.timeout_s <= 0 or now < self.next_check_at:
            return None
        if self.total_steps and self.facts.trained_version >= self.total_steps:
            return None
        self.next_check_at = now + self.timeout_s
        return diagnose(self.facts, now, self.timeout_s), self.policy.action(), now - self.last_step_at
