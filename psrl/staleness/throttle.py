"""The dispatch throttle: how many prompt groups may be launched ahead of the trainer.

At most `ahead + 1` buffers' worth of groups are dispatched beyond what the parameter server's
version has consumed, where `ahead = min(staleness, max_dispatch_ahead)`:

    allowance = (ps_version - initial_version + 1 + ahead) * groups_per_buffer - num_dispatched

This is upstream's rule ("dispatch the next batch once ps_version >= initial_version +
max(dispatched - ahead * B, 0) // B") turned into a count, so the caller never polls; it just
re-evaluates when the version or the count changes. Units are prompt groups; `groups_per_buffer`
is B' (the redundant batch size when batch-level redundancy is on).

Open question 19, settled: replacements (groups dispatched because a group was filtered, failed,
or aborted by the proactive filter) bypass the throttle and are NOT counted in `num_dispatched`.
The group they replace was counted when it was dispatched and will never fill a slot, so
counting the replacement too would shrink the in-flight budget by one group per drop.
`max_dispatch_ahead` is an ordinary config field (`psrl.max_dispatch_ahead`), not a hidden constant.
"""

from __future__ import annotations

from psrl.staleness.types import LedgerError


def dispatch_allowance(
    *,
    ps_version: int,
    initial_version: int,
    staleness: int,
    max_dispatch_ahead: int,
    groups_per_buffer: int,
    num_dispatched: int,
) -> int:
    """Prompt groups that may be dispatched now (never negative)."""
    if groups_per_buffer < 1 or num_dispatched < 0 or staleness < 0 or max_dispatch_ahead < 0:
        raise LedgerError("dispatch_allowance needs groups_per_buffer >= 1 and non-negative counts")
    ahead = min(staleness, max_dispatch_ahead)
    budget = (ps_version - initial_version + 1 + ahead) * groups_per_buffer
    return max(budget - num_dispatched, 0)


def required_ps_version(
    *, initial_version: int, staleness: int, max_dispatch_ahead: int, groups_per_buffer: int, num_dispatched: int
) -> int:
    """The parameter-server version at which the next (counted) group may be dispatched."""
    ahead = min(staleness, max_dispatch_ahead)
    return initial_version + max(num_dispatched // groups_per_buffer - ahead, 0)
