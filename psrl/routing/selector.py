"""Worker selection: the stages every request passes before the policy ranks instances.

``select`` is a pure function of a decision's recorded inputs:

1. version eligibility: ``inputs.candidates`` already holds only healthy instances whose
   version after sync is >= the request's V_traj (any version for an unversioned request);
2. hint pin: a sticky or force-pinned request is restricted to its hint instance when that
   instance is still a candidate (otherwise it falls through and routes freely);
3. group pin (``enable_group_sticky``): restricted to the instance of the prompt's earlier
   children when that one is still a candidate;
4. staleness reservation (unversioned requests): keep instances whose version the ledger can
   still place this prompt at;
5. priority groups by ``candidate_sort_indicator`` (``version``: newest first for a new
   trajectory, oldest acceptable first for a continuation; ``reserve_capability``: the ledger's
   reserve indicator first), then the admission gate (not paused, in-flight cap
   ``max_concurrent_seqs_per_instance``, empty engine waiting queue when
   ``admission_reject_on_waiting``, plus the policy's KV limits), then the policy.

Partial-rollout loopbacks that are neither sticky nor force-pinned route freely (migration and
preemption loopbacks exist to move; after a sync the old instance's prefix cache is gone
anyway); the decision names the hint as ``moved_from`` so the KV can be transferred.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from psrl.config.coordination import RoutingStrategy
from psrl.routing.decision import DecisionInputs, LedgerAnswer, Reason
from psrl.routing.policies.base import Choice, Groups, RoutingPolicy


@dataclass(frozen=True, slots=True)
class SelectionSettings:
    """The routing_strategy fields selection reads, copied once off the config."""

    candidate_sort_indicator: str = "version"
    max_concurrent_seqs_per_instance: int = 1024
    admission_reject_on_waiting: bool = True

    @classmethod
    def from_config(cls, settings: RoutingStrategy) -> SelectionSettings:
        return cls(
            settings.candidate_sort_indicator,
            settings.max_concurrent_seqs_per_instance,
            settings.admission_reject_on_waiting,
        )


@dataclass(frozen=True, slots=True)
class Selection:
    choice: Choice | None
    reason: str  # Reason.ROUTED or why the request stays queued
    pinned_by: str
    considered: tuple[int, ...] = ()  # candidate indices left after pins and reservation (stages 2-4)


def select(inputs: DecisionInputs, settings: SelectionSettings, policy: RoutingPolicy) -> Selection:
    cands = inputs.candidates
    if not cands:
        return Selection(None, Reason.NO_ELIGIBLE_VERSION, "")
    indices, pinned_by = _apply_pins(inputs)
    answers = {a.version: a for a in inputs.ledger}
    if inputs.request.is_unversioned and not all(a.can_reserve for a in inputs.ledger):
        indices = [i for i in indices if answers[cands[i].version].can_reserve]
        if not indices:
            return Selection(None, Reason.NO_RESERVABLE, pinned_by)
    groups = []
    for group in priority_groups(inputs, indices, settings.candidate_sort_indicator, answers):
        admitted = admitted_indices(inputs, group, settings, policy)
        if admitted:
            groups.append(admitted)
    if not groups:
        return Selection(None, Reason.NOT_ADMITTED, pinned_by, tuple(indices))
    result = policy.choose(inputs, groups)
    if isinstance(result, str):
        return Selection(None, result, pinned_by, tuple(indices))
    return Selection(result, Reason.ROUTED, pinned_by)


def _apply_pins(inputs: DecisionInputs) -> tuple[list[int], str]:
    cands = inputs.candidates
    for pin, label in ((inputs.hint_pin, "hint"), (inputs.group_pin, "group")):
        if pin is not None:
            pinned = [i for i, c in enumerate(cands) if c.instance_id == pin]
            if pinned:
                return pinned, label
    return list(range(len(cands))), ""


def admitted_indices(
    inputs: DecisionInputs, group: list[int], settings: SelectionSettings, policy: RoutingPolicy
) -> list[int]:
    """The admission gate: not paused, under the in-flight cap, no engine waiting queue (if set),
    and the policy's KV limits (against instances whose KV capacity is known)."""
    cands = inputs.candidates
    cap = settings.max_concurrent_seqs_per_instance or 1 << 62
    if settings.admission_reject_on_waiting:
        open_ = [
            i for i in group for c in (cands[i],) if c.num_inflight < cap and not c.num_waiting and not c.is_paused
        ]
    else:
        open_ = [i for i in group for c in (cands[i],) if c.num_inflight < cap and not c.is_paused]
    kv_limit, overload = policy.kv_admission_limit, policy.overload_limit
    if kv_limit is None and overload is None:
        return open_
    tokens = inputs.request.num_tokens
    kv_limit = math.inf if kv_limit is None else kv_limit
    overload = math.inf if overload is None else overload
    return [
        i
        for i in open_
        for c in (cands[i],)
        if c.kv_capacity_tokens <= 0
        or (c.kv_tokens + tokens <= kv_limit * c.kv_capacity_tokens and c.kv_tokens < overload * c.kv_capacity_tokens)
    ]


def priority_groups(
    inputs: DecisionInputs, indices: list[int], indicator: str, answers: dict[int, LedgerAnswer]
) -> Groups:
    """Candidates grouped by equal sort key, best key first; instance order within a group."""
    cands = inputs.candidates
    if len(inputs.ledger) == 1 or len(indices) == 1:  # a single candidate version: one group
        return [indices]
    versions = {cands[i].version for i in indices}
    if len(versions) == 1:
        return [indices]
    is_new = inputs.request.is_unversioned
    keys: dict[int, tuple[float, ...]] = {}
    for version in versions:
        version_key = -version if is_new else version
        use_indicator = indicator == "reserve_capability" and is_new
        keys[version] = (answers[version].indicator, version_key) if use_indicator else (version_key,)
    by_key: dict[tuple[float, ...], list[int]] = {}
    for i in indices:
        by_key.setdefault(keys[cands[i].version], []).append(i)
    return [by_key[key] for key in sorted(by_key)]
