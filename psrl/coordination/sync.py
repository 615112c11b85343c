"""When rollout instances pull new weights: ``greedy`` and ``status_based`` sync.

Every instance is first screened: one already syncing, already at the PS version, or whose
latest status report predates its last sync (its numbers describe the old weights) is left
alone. The warm-up guard holds everyone while ``ps_version <= seamless_train_version`` and
buffer ``ps_version`` is not yet ready, so training never waits on rollout during warm-up.

* ``greedy`` syncs every remaining instance at once (without partial rollout, only idle ones,
  since interrupting would throw their work away).
* ``status_based`` waits for a low point. Not while the router is half-way through a decision;
  with partial rollout the instance needs an empty engine waiting queue, no queued request it
  could still serve at its current version without opening a new staleness entry (when
  ``check_req_before_sync``), and its indicator at or below ``threshold``: ``request_num``
  (running + waiting), ``throughput`` (decode tokens/s), ``kv_cache`` (KV usage fraction) or
  ``hypothesis_test`` (see ``psrl.coordination.hypothesis``). Without partial rollout it must
  be idle.
"""

from __future__ import annotations

import msgspec

from psrl.config.coordination import SyncAndMigStrategy
from psrl.coordination.hypothesis import SyncBenefit, estimate_sync_benefit
from psrl.coordination.state import CoordinationInputs, InstanceState, load_indicator
from psrl.engine_cost.model import CostModel


class SyncDecision(msgspec.Struct, frozen=True, gc=False):
    instance_ids: tuple[str, ...]  # instances to sync now, in instance order
    reasons: dict[str, str]  # every instance -> why it syncs or not
    benefits: dict[str, SyncBenefit] = {}  # hypothesis_test estimates, per tested instance


class SyncPolicy:
    """A configured sync strategy; ``decide`` is a pure function of its inputs."""

    def __init__(
        self,
        settings: SyncAndMigStrategy,
        *,
        partial_rollout: bool,
        cost_model: CostModel | None = None,
        max_concurrent_seqs: int = 0,
    ) -> None:
        if settings.method == "status_based" and settings.sync.indicator == "hypothesis_test" and cost_model is None:
            raise ValueError("sync indicator hypothesis_test needs a cost model (routing_strategy.cost_model_path)")
        self.settings = settings
        self.partial_rollout = partial_rollout
        self.cost_model = cost_model
        self.max_concurrent_seqs = max_concurrent_seqs

    def decide(self, inputs: CoordinationInputs) -> SyncDecision:
        reasons: dict[str, str] = {}
        benefits: dict[str, SyncBenefit] = {}
        chosen: list[str] = []
        held = self._warmup_hold(inputs)
        for inst in inputs.instances:
            reason = held or _screen(inst, inputs.ps_version)
            if reason is None:
                reason = (
                    self._greedy(inst) if self.settings.method == "greedy" else self._status(inst, inputs, benefits)
                )
            reasons[inst.instance_id] = reason
            if reason in _SYNC_REASONS:
                chosen.append(inst.instance_id)
        return SyncDecision(tuple(chosen), reasons, benefits)

    def _warmup_hold(self, inputs: CoordinationInputs) -> str | None:
        guard = self.settings.sync.seamless_train_version
        if inputs.ps_version <= guard and inputs.ps_version not in inputs.ready_buffers:
            return "warmup_hold"
        return None

    def _greedy(self, inst: InstanceState) -> str:
        if not self.partial_rollout and inst.num_active > 0:
            return "busy_without_partial_rollout"
        return "greedy"

    def _status(self, inst: InstanceState, inputs: CoordinationInputs, benefits: dict[str, SyncBenefit]) -> str:
        snap, sync = inst.snapshot, self.settings.sync
        if snap is None:
            return "no_report"
        if inputs.router.is_selecting:
            return "router_selecting"
        if not self.partial_rollout:
            return "idle" if inst.num_active == 0 else "busy_without_partial_rollout"
        if snap.num_waiting > 0:
            return "engine_waiting"
        if sync.check_req_before_sync and inputs.router.servable_at(inst.version).without_new_entry > 0:
            return "queued_work_at_current_version"
        if sync.indicator == "hypothesis_test":
            return self._hypothesis(inst, inputs, benefits)
        threshold = sync.threshold if sync.threshold is not None else 0.0
        return "below_threshold" if load_indicator(snap, sync.indicator) <= threshold else "above_threshold"

    def _hypothesis(self, inst: InstanceState, inputs: CoordinationInputs, benefits: dict[str, SyncBenefit]) -> str:
        if self.cost_model is None:
            raise ValueError("hypothesis_test needs a cost model")
        sync = self.settings.sync
        estimate = estimate_sync_benefit(
            inst,
            inputs,
            self.cost_model,
            horizon_s=inputs.mean_version_interval_s or sync.hypothesis_horizon_s,
            pull_s=inst.last_pull_s if inst.last_pull_s is not None else sync.hypothesis_pull_s,
            max_concurrent_seqs=self.max_concurrent_seqs,
        )
        benefits[inst.instance_id] = estimate
        if not estimate.has_work_at_current:
            return "idle"
        return "benefit" if estimate.benefit > (sync.threshold or 0.0) else "no_benefit"


_SYNC_REASONS = frozenset({"greedy", "idle", "below_threshold", "benefit"})


def _screen(inst: InstanceState, ps_version: int) -> str | None:
    """Why an instance is not considered at all this tick, or None."""
    if inst.is_syncing:
        return "syncing"
    if inst.version >= ps_version:
        return "up_to_date"
    if inst.snapshot is not None and not inst.has_fresh_report:
        return "stale_report"
    return None
