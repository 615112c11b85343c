"""The staleness ledger: Reserve / Occupy / Consume over versioned staleness buffers.

Pure and single-owner: no I/O, no clock, no randomness, no locks. It lives in the router process
so that a routing decision can ask it questions without a network round trip; every mutating call
returns a frozen outcome record (see `types.py`) that the owner publishes as an event.

Model
-----
eta is `psrl.staleness`. Buffer `b` is the training batch the trainer consumes to go from version
`b` to `b + 1`; buffers are consumed strictly in order. Each buffer has B' slots (B' > B only with
batch-level redundancy) and is ready once B prompt groups occupy it. A group has N' children and
completes when its first N children finish. A child's version `V_traj` is the version of the
instance it was first routed to; it is fixed for the trajectory's whole life.

* Reserve (routing): the first child of a group takes a slot in the *latest* buffer of
  `[V, V + eta]` that has room (worst case). Later children join that entry when the entry's
  buffer stays inside their own window.
* Occupy (group complete): the group moves to the *earliest* buffer of its window with room. If a
  candidate is stuck (every free slot reserved), one of its reservations whose window reaches the
  group's old buffer is moved there (the swap), freeing the earlier slot. With batch redundancy a
  stuck buffer may hold more reservations than it still needs; then one of them is displaced
  (it keeps running without a slot, "floating") and the finished group lands now.
* Consume (trainer): takes the next buffer once it is ready.
* Staleness-driven abort: a version is dead once every unconsumed buffer of its window is full;
  every not-yet-occupied group of a dead version is aborted (reason STALE).

Invariants (checked by `psrl.staleness.invariants.check_invariants` and the property tests)
-------------------------------------------------------------------------------------------
1. Bound: every reserved or occupied group sits in a buffer `b` with `V <= b <= V + eta` for every
   child version that constrains it (all reserved children while in flight, the N winners once
   complete). Consequently every consumed trajectory satisfies `V_traj <= b <= V_traj + eta`, and
   with eta = 0 buffer `b` only ever holds version `b` (synchronous training).
2. Counts: per buffer, occupied <= B and occupied + reserved <= B'; the counters equal the number
   of live groups that point at the buffer.
3. No double counting: a prompt group is in exactly one of {live, closed}; a live group holds at
   most one slot; a consumed group is returned by exactly one `consume`.
4. Nothing lost: every group that ever reserved is live, or was returned by `consume`, or was
   returned in a `GroupAborted` with a reason.
5. Without redundancy (B' = B, N' = N) a reserved group always finds a slot when it completes
   (its own reserved slot at worst): NO_ROOM only happens to redundant work.
6. Versions are never ahead of the ledger: a version > `next_buffer_id` cannot exist yet (the
   trainer has not produced it), so every version is <= every unconsumed buffer id.

Settled questions (design digest section 13)
--------------------------------------------
* Q1 (where V_traj comes from): the caller passes the version of the weights the routed instance
  will use for the first token (the advertised post-sync version); the ledger only requires it to
  be a version that exists (<= next_buffer_id) and refuses others, so the gate belongs to routing.
* Q2 (per child vs per group): reservations are per child, the entry per group; a child at a newer
  version may join; the entry never moves when the minimum changes (see `group.py`).
* Q3 (swap rules): the swap only moves a reservation whose window reaches the freed slot, and only
  into a buffer that is not full; every move is re-checked by the invariant checker in tests.
* Q4 (proactive filter): see `proactive.py` (retry and a concrete truncate).
* Q12 (units): everything here counts prompt groups.

Chunk emission (fine-grain overlap): a buffer's occupied groups are kept in occupancy order, and
for the buffer the trainer consumes next that order is append-only (occupied groups are never
aborted, and the proactive filter only moves groups *into* it). Chunks can therefore be emitted as
consecutive slices of `occupied_groups(next_buffer_id)` as it grows; an emitted prefix never
shifts, unlike upstream's (version, arrival) ordering.
"""

from __future__ import annotations

import math
from collections import Counter

from psrl.staleness.buffer import Buffer
from psrl.staleness.group import Group
from psrl.staleness.types import (
    AbortReason,
    BufferCounts,
    BufferStatus,
    ChildRef,
    ConsumedBuffer,
    ConsumedGroup,
    FinishOutcome,
    FinishVerdict,
    GroupAborted,
    GroupState,
    LedgerCounts,
    LedgerError,
    LedgerSizes,
    OccupyOutcome,
    ReservationMove,
    ReserveRefusedError,
)

CONSUMED = None  # closed-group marker for "consumed" (aborted groups record their AbortReason)


class StalenessLedger:
    """Reserve / Occupy / Consume bookkeeping; see the module docstring for the invariants."""

    def __init__(self, sizes: LedgerSizes, *, next_buffer_id: int = 0) -> None:
        self.sizes = sizes
        self._eta = sizes.staleness
        self._next_buffer = next_buffer_id
        self._buffers: dict[int, Buffer] = {}
        self._groups: dict[int, Group] = {}
        self._live_by_version: dict[int, dict[int, None]] = {}  # not-yet-occupied groups by group version
        self._closed: dict[int, AbortReason | None] = {}
        self._closed_at: dict[int, list[int]] = {}  # next_buffer_id when closed -> prompt ids
        # Closed groups are remembered this many consumes, so late children are recognised as late.
        self.closed_retention = self._eta + 2
        self.num_bound_violations = 0

    # ---------------------------------------------------------------- routing-time queries

    def can_reserve(self, prompt_id: int, version: int) -> bool:
        """True when a child of `prompt_id` routed at `version` could reserve now."""
        return self.reserve_indicator(prompt_id, version) != math.inf

    def can_reserve_without_new_entry(self, prompt_id: int, version: int) -> bool:
        """True when the group already has an entry that a child at `version` may join."""
        group = self._groups.get(prompt_id)
        return group is not None and self._can_join(group, version)

    def has_group(self, prompt_id: int) -> bool:
        return prompt_id in self._groups

    def room_signature(self) -> tuple[int, frozenset[int]]:
        """What decides whether *new* groups can reserve at any version: the next buffer to
        consume and the buffers without room. New-group reservations can become possible only
        when the next buffer moves or a buffer leaves that set."""
        full = frozenset(b for b, buffer in self._buffers.items() if b >= self._next_buffer and not buffer.has_room)
        return self._next_buffer, full

    def reserve_indicator(self, prompt_id: int, version: int) -> float:
        """-inf: joins the group's existing entry; -b: new entry in buffer b; +inf: impossible."""
        group = self._groups.get(prompt_id)
        if group is not None:
            return -math.inf if self._can_join(group, version) else math.inf
        if prompt_id in self._closed:
            return math.inf
        buffer_id = self._new_entry_buffer(version)
        return math.inf if buffer_id is None else -float(buffer_id)

    # ---------------------------------------------------------------- reserve

    def reserve(self, prompt_id: int, child: int, version: int, instance: str) -> int:
        """Record that `child` of `prompt_id` was routed at `version` to `instance`; return its buffer id.

        Idempotent for a repeated identical call. Raises `ReserveRefusedError` when `can_reserve` is False.
        """
        if not 0 <= child < self.sizes.redundant_rollout_n:
            raise ReserveRefusedError(
                f"prompt {prompt_id}: child {child} outside 0..{self.sizes.redundant_rollout_n - 1}"
            )
        group = self._groups.get(prompt_id)
        if group is None:
            return self._reserve_new_group(prompt_id, child, version, instance)
        if child in group.child_versions:
            is_same_call = group.child_versions[child] == version and child not in group.aborted
            if is_same_call and group.state == GroupState.IN_FLIGHT and group.buffer_id is not None:
                return group.buffer_id
            raise ReserveRefusedError(f"prompt {prompt_id}: child {child} already reserved, aborted or closed")
        if child in group.aborted or not self._can_join(group, version):
            raise ReserveRefusedError(f"prompt {prompt_id}: child {child} at version {version} cannot join its group")
        buffer_id = group.buffer_id
        if buffer_id is None:  # unreachable: _can_join refuses floating groups
            raise LedgerError(f"prompt {prompt_id}: cannot join a group without a buffer")
        old_version = group.version
        group.add_child(child, version, instance)
        if group.version != old_version:
            self._reindex(group, old_version)
        return buffer_id

    def _reserve_new_group(self, prompt_id: int, child: int, version: int, instance: str) -> int:
        if prompt_id in self._closed:
            raise ReserveRefusedError(f"prompt {prompt_id}: group already closed")
        buffer_id = self._new_entry_buffer(version)
        if buffer_id is None:
            raise ReserveRefusedError(f"prompt {prompt_id}: no buffer of [{version}, {version + self._eta}] has room")
        group = Group(prompt_id, version, buffer_id)
        group.add_child(child, version, instance)
        self._groups[prompt_id] = group
        self._buffer(buffer_id).add_reservation(prompt_id, version)
        self._live_by_version.setdefault(version, {})[prompt_id] = None
        return buffer_id

    # ---------------------------------------------------------------- finish / occupy

    def finish_child(self, prompt_id: int, child: int) -> FinishOutcome:
        """Count a finished child; the N-th completes the group and aborts its surplus children."""
        group = self._groups.get(prompt_id)
        if group is None:
            verdict = FinishVerdict.LATE if prompt_id in self._closed else FinishVerdict.UNKNOWN
            return FinishOutcome(prompt_id, child, verdict)
        if child not in group.child_versions:
            return FinishOutcome(prompt_id, child, FinishVerdict.UNKNOWN)
        if child in group.finished:
            return FinishOutcome(prompt_id, child, FinishVerdict.DUPLICATE)
        if child in group.aborted or group.state != GroupState.IN_FLIGHT:
            return FinishOutcome(prompt_id, child, FinishVerdict.LATE)
        group.finished.append(child)
        if len(group.finished) < self.sizes.alg_rollout_n:
            return FinishOutcome(prompt_id, child, FinishVerdict.ACCEPTED)
        surplus = self._complete(group, tuple(group.finished))
        return FinishOutcome(prompt_id, child, FinishVerdict.GROUP_COMPLETE, group.winners, surplus)

    def _complete(self, group: Group, winners: tuple[int, ...]) -> tuple[ChildRef, ...]:
        surplus = tuple(ref for ref in group.open_children(self.sizes.redundant_rollout_n) if ref.child not in winners)
        group.aborted.update(ref.child for ref in surplus)
        old_version = group.version
        group.complete(winners)
        if group.version != old_version:
            self._reindex(group, old_version)
        return surplus

    def occupy(self, prompt_id: int) -> OccupyOutcome:
        """Place a complete group in the earliest buffer of its window that has room."""
        group = self._groups.get(prompt_id)
        if group is None or group.state != GroupState.COMPLETE:
            raise LedgerError(f"prompt {prompt_id}: only a complete group can occupy")
        reserved_buffer = group.buffer_id
        self._release(group)
        target, move = self._choose_occupancy(group.version, reserved_buffer)
        if target is None:
            del self._groups[prompt_id]
            self._mark_closed(prompt_id, AbortReason.NO_ROOM)
            return OccupyOutcome(prompt_id, None, False, None, (GroupAborted(prompt_id, AbortReason.NO_ROOM, ()),))
        buffer = self._buffer(target)
        buffer.add_occupant(prompt_id)
        group.state = GroupState.OCCUPIED
        group.buffer_id = target
        aborted = self._abort_dead_groups() if buffer.is_full else ()
        return OccupyOutcome(prompt_id, target, buffer.is_full, move, aborted)

    def _choose_occupancy(self, version: int, reserved: int | None) -> tuple[int | None, ReservationMove | None]:
        for target in range(self._next_buffer, version + self._eta + 1):
            buffer = self._buffers.get(target)
            if buffer is None or buffer.has_room:
                return target, None
            if buffer.is_full:
                continue
            move = self._swap_into(buffer, reserved) or self._displace_redundant(buffer)
            if move is not None:
                return target, move
        return None, None

    def _swap_into(self, buffer: Buffer, reserved: int | None) -> ReservationMove | None:
        """Move one of `buffer`'s reservations into the slot just freed in the later buffer `reserved`."""
        if reserved is None or buffer.buffer_id >= reserved or self._buffers[reserved].is_full:
            return None
        movable = buffer.find_movable(reserved - self._eta)
        if movable is None:
            return None
        moved_prompt, moved_version = movable
        buffer.remove_reservation(moved_prompt, moved_version)
        self._buffers[reserved].add_reservation(moved_prompt, moved_version)
        self._groups[moved_prompt].buffer_id = reserved
        return ReservationMove(moved_prompt, buffer.buffer_id, reserved)

    def _displace_redundant(self, buffer: Buffer) -> ReservationMove | None:
        """With batch redundancy a stuck buffer may hold more reservations than it still needs;
        one of them gives up its slot (and floats) so a finished group can land now."""
        if buffer.num_reserved <= self.sizes.ready_entries - buffer.num_occupied:
            return None
        movable = buffer.find_movable(-1)
        if movable is None:
            return None
        moved_prompt, moved_version = movable
        buffer.remove_reservation(moved_prompt, moved_version)
        self._groups[moved_prompt].buffer_id = None
        return ReservationMove(moved_prompt, buffer.buffer_id, None)

    # ---------------------------------------------------------------- aborts

    def abort_child(self, prompt_id: int, child: int, reason: AbortReason = AbortReason.FAILED) -> GroupAborted | None:
        """Drop one unfinished child; the group is aborted too once it can no longer reach N children."""
        group = self._groups.get(prompt_id)
        if group is None or child in group.aborted:
            return None
        if child in group.finished:
            raise LedgerError(f"prompt {prompt_id}: child {child} already finished and cannot be aborted")
        if not 0 <= child < self.sizes.redundant_rollout_n:
            raise LedgerError(f"prompt {prompt_id}: child {child} outside 0..{self.sizes.redundant_rollout_n - 1}")
        group.aborted.add(child)
        if group.num_viable_children(self.sizes.redundant_rollout_n) < self.sizes.alg_rollout_n:
            return self._close_aborted(group, reason)
        return None

    def abort_group(self, prompt_id: int, reason: AbortReason) -> GroupAborted | None:
        """Drop a group that is not occupied yet (filters run before `occupy`). Idempotent."""
        group = self._groups.get(prompt_id)
        if group is None:
            return None
        if group.state == GroupState.OCCUPIED:
            raise LedgerError(f"prompt {prompt_id}: an occupied group cannot be aborted (filter before occupy)")
        return self._close_aborted(group, reason)

    def _close_aborted(self, group: Group, reason: AbortReason) -> GroupAborted:
        children = group.open_children(self.sizes.redundant_rollout_n)
        group.aborted.update(ref.child for ref in children)
        self._release(group)
        del self._groups[group.prompt_id]
        self._mark_closed(group.prompt_id, reason)
        return GroupAborted(group.prompt_id, reason, children)

    def _abort_dead_groups(self) -> tuple[GroupAborted, ...]:
        aborted: list[GroupAborted] = []
        for version in [v for v in self._live_by_version if self.is_version_dead(v)]:
            for prompt_id in list(self._live_by_version.get(version, ())):
                aborted.append(self._close_aborted(self._groups[prompt_id], AbortReason.STALE))
        return tuple(aborted)

    # ---------------------------------------------------------------- consume

    def consume(self, buffer_id: int) -> ConsumedBuffer:
        """Hand the next ready buffer to the trainer; returns its groups in occupancy order."""
        if buffer_id != self._next_buffer:
            raise LedgerError(f"buffers are consumed in order: next is {self._next_buffer}, got {buffer_id}")
        buffer = self._buffers.get(buffer_id)
        if buffer is None or not buffer.is_full:
            raise LedgerError(f"buffer {buffer_id} is not ready ({self.buffer_counts(buffer_id)})")
        groups, histogram, violations = [], Counter[int](), 0
        for prompt_id in buffer.occupied:
            group = self._groups.pop(prompt_id)
            for _, version in group.winner_versions():
                histogram[buffer_id - version] += 1
                if not 0 <= buffer_id - version <= self._eta:
                    violations += 1
            groups.append(ConsumedGroup(prompt_id, group.winner_versions()))
            self._mark_closed(prompt_id, CONSUMED)
        for prompt_id in buffer.reserved_prompt_ids():
            self._groups[prompt_id].buffer_id = None  # surplus reservation: it may still land later
        del self._buffers[buffer_id]
        self._next_buffer += 1
        self.num_bound_violations += violations
        # No version dies here: consuming removes a full buffer from a window, never one with room.
        self._prune_closed()
        return ConsumedBuffer(buffer_id, tuple(groups), dict(histogram), violations)

    # ---------------------------------------------------------------- state queries

    @property
    def next_buffer_id(self) -> int:
        """The buffer the trainer consumes next (= the newest version that can exist)."""
        return self._next_buffer

    def is_version_dead(self, version: int) -> bool:
        """True when no unconsumed buffer of `[version, version + eta]` can take another group."""
        for buffer_id in range(self._next_buffer, version + self._eta + 1):
            buffer = self._buffers.get(buffer_id)
            if buffer is None or not buffer.is_full:
                return False
        return True

    def buffer_counts(self, buffer_id: int) -> BufferCounts:
        buffer = self._buffers.get(buffer_id)
        if buffer is None:
            status = BufferStatus.PENDING
            return BufferCounts(buffer_id, 0, 0, self.sizes.num_slots, status)
        return buffer.counts()

    def is_ready(self, buffer_id: int) -> bool:
        buffer = self._buffers.get(buffer_id)
        return buffer is not None and buffer.is_full

    def occupied_groups(self, buffer_id: int) -> list[int]:
        buffer = self._buffers.get(buffer_id)
        return list(buffer.occupied) if buffer is not None else []

    def reserved_groups(self, buffer_id: int) -> list[int]:
        buffer = self._buffers.get(buffer_id)
        return buffer.reserved_prompt_ids() if buffer is not None else []

    def group_state(self, prompt_id: int) -> GroupState | None:
        group = self._groups.get(prompt_id)
        return group.state if group is not None else None

    def group_version(self, prompt_id: int) -> int | None:
        group = self._groups.get(prompt_id)
        return group.version if group is not None else None

    def group_buffer(self, prompt_id: int) -> int | None:
        group = self._groups.get(prompt_id)
        return group.buffer_id if group is not None else None

    def is_child_open(self, prompt_id: int, child: int) -> bool:
        """False once the child finished, was aborted, or its group closed: drop it from queues."""
        group = self._groups.get(prompt_id)
        if group is None:
            return prompt_id not in self._closed
        return child not in group.aborted and child not in group.finished

    def closed_reason(self, prompt_id: int) -> AbortReason | None:
        """The abort reason of a recently closed group (None also for consumed or unknown groups)."""
        return self._closed.get(prompt_id)

    def counts(self) -> LedgerCounts:
        states = Counter(g.state for g in self._groups.values())
        floating = sum(1 for g in self._groups.values() if g.buffer_id is None)
        buffers = tuple(self._buffers[b].counts() for b in sorted(self._buffers))
        return LedgerCounts(
            next_buffer_id=self._next_buffer,
            num_in_flight=states[GroupState.IN_FLIGHT],
            num_complete=states[GroupState.COMPLETE],
            num_occupied=states[GroupState.OCCUPIED],
            num_floating=floating,
            buffers=buffers,
        )

    # ---------------------------------------------------------------- moves used by the proactive filter

    def move_occupied(self, prompt_id: int, target: int) -> tuple[GroupAborted, ...]:
        """Move an occupied group from a buffer that is not ready into `target` (bound re-checked)."""
        group = self._groups.get(prompt_id)
        if group is None or group.state != GroupState.OCCUPIED or group.buffer_id is None:
            raise LedgerError(f"prompt {prompt_id}: only an occupied group can move")
        if target == group.buffer_id:
            raise LedgerError(f"prompt {prompt_id}: already in buffer {target}")
        source = self._buffers[group.buffer_id]
        newest = max(v for _, v in group.winner_versions())
        if source.is_full:
            raise LedgerError(f"prompt {prompt_id}: buffer {source.buffer_id} is ready; its groups stay")
        if not (max(newest, self._next_buffer) <= target <= group.version + self._eta):
            raise LedgerError(f"prompt {prompt_id}: buffer {target} is outside its window")
        destination = self._buffer(target)
        if not destination.has_room:
            raise LedgerError(f"prompt {prompt_id}: buffer {target} has no room")
        source.remove_occupant(prompt_id)
        destination.add_occupant(prompt_id)
        group.buffer_id = target
        return self._abort_dead_groups() if destination.is_full else ()

    def force_complete(self, prompt_id: int) -> tuple[tuple[int, ...], tuple[ChildRef, ...], tuple[ChildRef, ...]]:
        """Complete an in-flight group now: winners = finished children, then running ones in
        reservation order. Returns (winners, truncated running winners, surplus children)."""
        group = self._groups.get(prompt_id)
        if group is None or group.state != GroupState.IN_FLIGHT:
            raise LedgerError(f"prompt {prompt_id}: only an in-flight group can be force-completed")
        running = group.running_children()
        missing = self.sizes.alg_rollout_n - len(group.finished)
        if len(running) < missing:
            raise LedgerError(f"prompt {prompt_id}: {len(running)} running children cannot fill {missing} places")
        truncated = tuple(running[:missing])
        group.finished.extend(truncated)
        surplus = self._complete(group, tuple(group.finished))
        return group.winners, tuple(ChildRef(c, group.child_instances[c]) for c in truncated), surplus

    def num_running_children(self, prompt_id: int) -> tuple[int, int]:
        """(finished, running) children of a live group; (0, 0) when not live."""
        group = self._groups.get(prompt_id)
        if group is None:
            return 0, 0
        return len(group.finished), len(group.running_children())

    # ---------------------------------------------------------------- internals

    def _buffer(self, buffer_id: int) -> Buffer:
        buffer = self._buffers.get(buffer_id)
        if buffer is None:
            if buffer_id < self._next_buffer:
                raise LedgerError(f"buffer {buffer_id} was already consumed")
            buffer = Buffer(buffer_id, self.sizes.num_slots, self.sizes.ready_entries)
            self._buffers[buffer_id] = buffer
        return buffer

    def _new_entry_buffer(self, version: int) -> int | None:
        """Latest buffer of `[version, version + eta]` that accepts a new reservation."""
        if not 0 <= version <= self._next_buffer:
            return None
        for buffer_id in range(version + self._eta, self._next_buffer - 1, -1):
            buffer = self._buffers.get(buffer_id)
            if buffer is None or buffer.has_room:
                return buffer_id
        return None

    def _can_join(self, group: Group, version: int) -> bool:
        if group.state != GroupState.IN_FLIGHT or group.buffer_id is None:
            return False
        if not 0 <= version <= self._next_buffer:
            return False
        if version >= group.version:
            return True
        return version + self._eta >= group.buffer_id and not self.is_version_dead(version)

    def _release(self, group: Group) -> None:
        """Drop a not-yet-occupied group's reservation and its live-index entry."""
        if group.buffer_id is not None:
            self._buffers[group.buffer_id].remove_reservation(group.prompt_id, group.version)
        ids = self._live_by_version[group.version]
        del ids[group.prompt_id]
        if not ids:
            del self._live_by_version[group.version]

    def _reindex(self, group: Group, old_version: int) -> None:
        if group.buffer_id is not None:
            buffer = self._buffers[group.buffer_id]
            buffer.remove_reservation(group.prompt_id, old_version)
            buffer.add_reservation(group.prompt_id, group.version)
        ids = self._live_by_version[old_version]
        del ids[group.prompt_id]
        if not ids:
            del self._live_by_version[old_version]
        self._live_by_version.setdefault(group.version, {})[group.prompt_id] = None

    def _mark_closed(self, prompt_id: int, reason: AbortReason | None) -> None:
        self._closed[prompt_id] = reason
        self._closed_at.setdefault(self._next_buffer, []).append(prompt_id)

    def _prune_closed(self) -> None:
        horizon = self._next_buffer - self.closed_retention
        for epoch in [e for e in self._closed_at if e < horizon]:
            for prompt_id in self._closed_at.pop(epoch):
                self._closed.pop(prompt_id, None)
