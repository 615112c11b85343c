"""The preemption loopback rule (``max_num_waiting_reqs_after_preemption``).

When an engine preempts requests under KV pressure they wait inside that engine. Once its
waiting queue holds more than the threshold, the preempted requests are handed back to the
router, which can place them on another instance. 0 hands them back at once (recommended for
reasoning workloads); the default 1024 practically never does.
"""

from __future__ import annotations

from collections.abc import Sequence


def preempted_to_loop_back(preempted_request_ids: Sequence[int], num_waiting: int, threshold: int) -> tuple[int, ...]:
    """Which of the engine's preempted requests go back to the router now (all or none)."""
    if threshold < 0:
        raise ValueError(f"max_num_waiting_reqs_after_preemption must be >= 0, got {threshold}")
    if num_waiting > threshold:
        return tuple(preempted_request_ids)
    return ()
