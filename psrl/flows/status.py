"""Instance status reports as the decision code reads them."""

from __future__ import annotations

from bus.messages import InstanceStatus
from psrl.routing.instance import InstanceSnapshot


def snapshot_from_status(s: InstanceStatus) -> InstanceSnapshot:
    """The routing/coordination view of one ``inst.status`` report."""
    return InstanceSnapshot(
        instance_id=s.instance,
        seq=s.report_seq,
        model_version=s.weight_version,
        num_running=s.num_running,
        num_waiting=s.num_waiting,
        kv_tokens=s.num_tokens_running,
        kv_capacity_tokens=s.kv_capacity_tokens,
        kv_usage=s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0,
        budget_kv_tokens=s.budget_kv_tokens,
        response_tokens=s.num_response_tokens,
        throughput=s.tokens_per_s,
        last_dispatch_seq=s.last_dispatch_seq,
    )
