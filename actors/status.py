"""Instance status reports as the decision code reads them."""

from __future__ import annotations

from bus.messages import InstanceStatus
from psrl.routing.instance import InstanceSnapshot


def snapshot_from_status(s: InstanceStatus) -> InstanceSnapshot:
    """The routing/coordination view of one `inst.status` report."""
    kv_usage = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
    return InstanceSnapshot(
        s.instance, s.report_seq, s.weight_version, s.num_running, s.num_waiting, s.num_tokens_running,
        s.kv_capacity_tokens, kv_usage, s.budget_kv_tokens, s.num_response_tokens, s.tokens_per_s,
        s.last_dispatch_seq,
    )  # fmt: skip
