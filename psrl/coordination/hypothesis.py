"""hypothesis_test: sync an instance only if the cost model says syncing now pays off.

The test compares two plans for one instance over a horizon ``H`` (the measured time between
PS versions: by then the instance must move on anyway), counting useful decode tokens:

* WAIT: keep version ``v``. The instance serves its ``n`` active requests plus ``add_v`` queued
  requests it can still take at ``v``, until that work runs out, then pulls (``pull_s``; nothing
  to re-prefill) and serves the ``add_P - add_v`` requests only the new version can take.
* NOW: pull version ``P`` now. The instance is down for ``D = pull_s + prefill_time(K)``: the
  pull, then re-prefilling the ``K`` context tokens of the interrupted requests (the GPU prefix
  cache does not survive a weight load). Then it serves its ``n`` requests plus ``add_P``.

A batch of ``m`` requests with ``W`` remaining tokens drains with the long tail: remaining
lengths are taken as spread evenly up to twice their mean, so it needs ``2 W / m`` decode steps
at the step time of the half-drained batch, ``step_time(m / 2, kv / 2)``; a horizon that ends
earlier gets its share of ``W`` pro rata. Remaining work is ``max(1, r - g)`` per active request
(``r`` the mean response length, ``g`` what the active ones generated so far) and ``r`` per
queued one; a queued request adds ``p`` (mean prompt) KV tokens. ``add_v`` and ``add_P`` are the
router's counts of queued requests servable at each version, capped by the instance's room (the
in-flight cap, and KV capacity at ``p + r`` tokens per request).

``benefit = tokens(NOW) - tokens(WAIT)``. The instance syncs when the benefit is above the
threshold (default 0), or when WAIT has no useful work at all (an idle instance loses nothing).
When both plans finish all their work within the horizon the benefit is 0 and the instance
keeps running: syncing would only spend GPU time on re-prefill.
Syncing early is worth it when the new version has much more work than the old one can still
take; it is not when the running requests carry a large context to re-prefill or the old
version still has as much work as the new one.
"""

from __future__ import annotations

import math

import msgspec

from psrl.coordination.state import CoordinationInputs, InstanceState
from psrl.engine_cost.model import CostModel, fresh_attention


class SyncBenefit(msgspec.Struct, frozen=True, gc=False):
    instance_id: str
    tokens_if_wait: float
    tokens_if_sync: float
    downtime_s: float
    horizon_s: float
    has_work_at_current: bool  # anything useful left to do at the instance's current version

    @property
    def benefit(self) -> float:
        return self.tokens_if_sync - self.tokens_if_wait


class _Batch(msgspec.Struct, frozen=True, gc=False):
    num_requests: float
    kv_tokens: float
    work_tokens: float  # tokens still to generate


def drain_seconds(model: CostModel, batch: _Batch) -> float:
    """Time for a batch to finish all its work, long tail included (see module doc)."""
    if batch.num_requests <= 0 or batch.work_tokens <= 0:
        return 0.0
    steps = 2.0 * batch.work_tokens / batch.num_requests
    return steps * model.step_time(max(1, round(batch.num_requests / 2)), batch.kv_tokens / 2)


def served_tokens(model: CostModel, batch: _Batch, seconds: float) -> float:
    """Tokens a batch produces within ``seconds`` (pro rata when it cannot drain in time)."""
    drain_s = drain_seconds(model, batch)
    if seconds <= 0 or drain_s <= 0:
        return 0.0
    return batch.work_tokens * min(1.0, seconds / drain_s)


def estimate_sync_benefit(
    inst: InstanceState,
    inputs: CoordinationInputs,
    model: CostModel,
    *,
    horizon_s: float,
    pull_s: float,
    max_concurrent_seqs: int,
) -> SyncBenefit:
    snap = inst.snapshot
    if snap is None:
        raise ValueError(f"instance {inst.instance_id} has no status report to test")
    n, kv = snap.num_running + snap.num_waiting, float(snap.kv_tokens)
    prompt, response = inputs.mean_prompt_tokens, inputs.mean_response_tokens
    remaining_keep = n * max(1.0, response - snap.response_tokens / n) if n else 0.0
    room = _room(n, kv, snap.kv_capacity_tokens, prompt + response, max_concurrent_seqs)
    add_v = min(inputs.router.servable_at(inst.version).total, room)
    add_p = min(inputs.router.servable_at(inputs.ps_version).total, room)

    wait_batch = _Batch(n + add_v, kv + add_v * prompt, remaining_keep + add_v * response)
    drain_s = drain_seconds(model, wait_batch)
    later = max(0, add_p - add_v)
    after_batch = _Batch(later, later * prompt, later * response)
    tokens_wait = served_tokens(model, wait_batch, horizon_s) + served_tokens(
        model, after_batch, horizon_s - drain_s - pull_s
    )
    downtime = pull_s + model.prefill_time(kv, n * fresh_attention(kv / n) if n else 0.0)  # n contexts of kv / n
    now_batch = _Batch(n + add_p, kv + add_p * prompt, remaining_keep + add_p * response)
    tokens_now = served_tokens(model, now_batch, horizon_s - downtime)
    has_work = wait_batch.work_tokens > 0
    return SyncBenefit(inst.instance_id, tokens_wait, tokens_now, downtime, horizon_s, has_work)


def _room(num_active: int, kv_tokens: float, capacity: int, tokens_per_request: float, cap: int) -> int:
    """How many more requests the instance could hold."""
    room = math.inf if cap <= 0 else max(0, cap - num_active)
    if capacity > 0 and tokens_per_request > 0:
        room = min(room, max(0.0, (capacity - kv_tokens) // tokens_per_request))
    return int(room) if math.isfinite(room) else 1 << 30
