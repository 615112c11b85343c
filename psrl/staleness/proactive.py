"""The proactive filter: stop waiting for the last stragglers of the buffer the trainer needs next.

Open question 4 of the design digest, settled here. Both methods act only on the buffer the
trainer consumes next (`b = ledger.next_buffer_id`) and only when its *gap* is small:
`0 < gap <= threshold`, where gap = B - occupied(b) - (complete groups reserved in b, which are
about to occupy it anyway). Call `apply_proactive_filter` whenever the trainer waits on `b` and
after every event that touches `b`; it returns None when there is nothing to do.

* ``retry``: if later, not-yet-ready buffers hold at least `gap` occupied groups, abort every
  in-flight group reserved in `b` (reason RETRY), move `gap` occupied groups from the later buffers
  into `b` (lowest version first, i.e. the ones closest to their bound; each move is legal only
  when `V <= b`, which the ledger re-checks), and report how many fresh prompts to dispatch (one
  per aborted group). `b` becomes ready at once.
* ``truncate``: force-complete `gap` in-flight groups reserved in `b` with their partial output:
  each group's winners are its finished children plus running children in reservation order;
  the running winners must be stopped and their tokens so far used as the response (finish
  reason TRUNCATED); other unfinished children are surplus. The groups occupy `b` immediately, so
  `b` becomes ready; the owner must wait for the truncated children's partial outputs before it
  hands `b` to the trainer. Truncated groups skip the group filter (they are already occupied).
  Groups with fewer than N routed children cannot be truncated; when fewer than `gap` groups
  qualify, nothing happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.types import AbortReason, ChildRef, GroupAborted, GroupState, OccupyOutcome

FilterMethod = Literal["retry", "truncate"]


@dataclass(frozen=True)
class RetryOutcome:
    buffer_id: int
    moved: tuple[int, ...]  # prompt ids moved into the buffer
    aborted: tuple[GroupAborted, ...]  # the stragglers (RETRY) and any group this made stale
    num_fresh_prompts: int  # dispatch this many new prompts (they bypass the dispatch throttle)
    is_buffer_ready: bool


@dataclass(frozen=True)
class TruncatedGroup:
    prompt_id: int
    winners: tuple[int, ...]
    truncated: tuple[ChildRef, ...]  # stop these and use their partial output
    surplus: tuple[ChildRef, ...]  # abort these


@dataclass(frozen=True)
class TruncateOutcome:
    buffer_id: int
    groups: tuple[TruncatedGroup, ...]
    occupancies: tuple[OccupyOutcome, ...]
    is_buffer_ready: bool


def apply_proactive_filter(
    ledger: StalenessLedger, method: FilterMethod | None, threshold: int
) -> RetryOutcome | TruncateOutcome | None:
    if method is None:
        return None
    if method == "retry":
        return proactive_retry(ledger, threshold)
    return proactive_truncate(ledger, threshold)


def effective_gap(ledger: StalenessLedger) -> int:
    """Groups the next buffer still misses, not counting complete groups reserved there."""
    buffer_id = ledger.next_buffer_id
    counts = ledger.buffer_counts(buffer_id)
    num_complete = sum(1 for p in ledger.reserved_groups(buffer_id) if ledger.group_state(p) == GroupState.COMPLETE)
    return ledger.sizes.ready_entries - counts.num_occupied - num_complete


def proactive_retry(ledger: StalenessLedger, threshold: int) -> RetryOutcome | None:
    buffer_id = ledger.next_buffer_id
    gap = effective_gap(ledger)
    if not 0 < gap <= threshold:
        return None
    movable = _movable_groups(ledger, buffer_id)
    if len(movable) < gap:
        return None
    stragglers = [p for p in ledger.reserved_groups(buffer_id) if ledger.group_state(p) == GroupState.IN_FLIGHT]
    aborted: list[GroupAborted] = []
    for prompt_id in stragglers:
        outcome = ledger.abort_group(prompt_id, AbortReason.RETRY)
        if outcome is not None:
            aborted.append(outcome)
    moved = tuple(movable[:gap])
    for prompt_id in moved:
        aborted.extend(ledger.move_occupied(prompt_id, buffer_id))
    return RetryOutcome(buffer_id, moved, tuple(aborted), len(stragglers), ledger.is_ready(buffer_id))


def _movable_groups(ledger: StalenessLedger, buffer_id: int) -> list[int]:
    """Occupied groups of later, not-ready buffers that may legally sit in `buffer_id`, best first."""
    candidates: list[tuple[int, int, int]] = []
    eta = ledger.sizes.staleness
    for later in range(buffer_id + 1, buffer_id + eta + 1):
        if ledger.is_ready(later):
            continue
        for prompt_id in ledger.occupied_groups(later):
            version = ledger.group_version(prompt_id)
            if version is not None and version <= buffer_id <= version + eta:
                candidates.append((version, -later, prompt_id))
    return [prompt_id for _, _, prompt_id in sorted(candidates)]


def proactive_truncate(ledger: StalenessLedger, threshold: int) -> TruncateOutcome | None:
    buffer_id = ledger.next_buffer_id
    gap = effective_gap(ledger)
    if not 0 < gap <= threshold:
        return None
    candidates: list[tuple[int, int]] = []
    for prompt_id in ledger.reserved_groups(buffer_id):
        if ledger.group_state(prompt_id) != GroupState.IN_FLIGHT:
            continue
        num_finished, num_running = ledger.num_running_children(prompt_id)
        if num_finished + num_running >= ledger.sizes.alg_rollout_n:
            candidates.append((-num_finished, prompt_id))
    if len(candidates) < gap:
        return None
    groups, occupancies = [], []
    for _, prompt_id in sorted(candidates)[:gap]:
        winners, truncated, surplus = ledger.force_complete(prompt_id)
        groups.append(TruncatedGroup(prompt_id, winners, truncated, surplus))
        occupancies.append(ledger.occupy(prompt_id))
    return TruncateOutcome(buffer_id, tuple(groups), tuple(occupancies), ledger.is_ready(buffer_id))
