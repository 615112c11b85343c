"""Records of routing decisions: the inputs a policy saw and what it chose.

A ``DecisionInputs`` holds everything worker selection read for one request: the request, the
instances that passed the version filter (as ``CandidateState`` copies), the pins, the ledger's
answers per candidate version, per-instance prefix matches and the round-robin cursor. Selection
is a pure function of it (``psrl.routing.selector.select``), so a replay re-derives each decision
from its record alone, and a what-if replay re-runs it with other settings.
"""

from __future__ import annotations

import msgspec

from psrl.routing.instance import CandidateState
from psrl.routing.request import RoutingRequest


class Reason:
    """Why a decision came out as it did (string constants, stable in logs)."""

    ROUTED = "routed"
    NO_ELIGIBLE_VERSION = "no_eligible_version"  # no routable instance at version >= V_traj
    NO_RESERVABLE = "no_reservable"  # the ledger cannot place the trajectory at any candidate version
    LEDGER_REFUSED = "ledger_refused"  # the ledger refused the reservation it had allowed (detail: its error)
    NOT_ADMITTED = "not_admitted"  # the admission gate refused every candidate
    NO_GAIN = "no_gain"  # throughput_optimal: no marginal gain above the threshold
    PAUSED = "paused"  # the routing loop is paused


class LedgerAnswer(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """The ledger's answers for one (prompt, version) pair, asked once per decision."""

    version: int
    can_reserve: bool
    indicator: float


class DecisionInputs(msgspec.Struct, frozen=True, gc=False):
    seq: int  # decision sequence number (also the random policy's draw index)
    request: RoutingRequest
    candidates: tuple[CandidateState, ...]  # routable instances with version >= V_traj
    num_instances: int  # size of the instance order (round robin wraps on it)
    hint_pin: str | None  # sticky / force-pin instance, when the request carries one
    group_pin: str | None  # instance already chosen for the prompt group (enable_group_sticky)
    ledger: tuple[LedgerAnswer, ...]  # one per distinct candidate version (unversioned requests only)
    gpu_match_tokens: dict[str, int]  # instance -> prefix tokens routed there before (cache-aware; matches only)
    offload_match_tokens: dict[str, int]  # instance -> prefix tokens in its offloaded tier (v1; matches only)
    tree_tokens: dict[str, int]  # instance -> tokens held by its routing prefix tree (cache-aware only)
    rr_cursor: int


class RoutingDecision(msgspec.Struct, frozen=True, gc=False):
    """One decision: where the request went (or why it stays queued) and from which inputs."""

    seq: int
    request_id: int
    prompt_id: int
    reason: str  # Reason.* (policy detail in ``detail``)
    instance_id: str | None  # None: the request stays queued
    version_tag: int  # V_traj after the decision
    reserved_buffer: int | None  # buffer reserved for a first routing
    pinned_by: str  # "", "hint" or "group"
    priority_group: int  # index of the priority group the choice came from (-1 if none)
    score: float  # the policy's score of the chosen instance (gain, overlap, load...)
    detail: str  # policy-specific: "least_load", "cache_hit", "shortest_queue", ...
    moved_from: str | None  # hint instance when the request left it (KV transfer source)
    dispatch_seq: int  # routed: sequence number to send with the request; engines echo the last one admitted
    inputs: DecisionInputs | None

    @property
    def is_routed(self) -> bool:
        return self.instance_id is not None
