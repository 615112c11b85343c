"""Vocabulary of the staleness ledger: sizes, states, abort reasons and the outcome records.

Every mutating ledger call returns one of the frozen outcome records below. They are what the
owning actor publishes as events, so the coordinator (and a replay) learns everything the ledger
decided without querying it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, NamedTuple

from psrl.errors import PsrlError

if TYPE_CHECKING:
    from psrl.config import Config


class LedgerError(PsrlError):
    """A ledger call that breaks the protocol (wrong order, unknown group, illegal move)."""


class ReserveRefusedError(LedgerError):
    """`reserve` was called for a (prompt, child, version) that `can_reserve` would refuse."""


class BufferStatus(IntEnum):
    """State of one staleness buffer, from its counters (B = ready entries, B' = slots)."""

    PENDING = 0  # fewer than B occupied, at least one empty slot: accepts reservations
    STUCK = 1  # fewer than B occupied, every other slot reserved: waits for stragglers
    READY = 2  # B occupied, no empty slot left
    READY_WITH_CAPACITY = 3  # B occupied, empty slots remain (only with batch-level redundancy)


class GroupState(IntEnum):
    """Lifecycle of a live prompt group (closed groups leave the ledger)."""

    IN_FLIGHT = 0  # reserved, fewer than N children finished
    COMPLETE = 1  # N children finished, waiting for `occupy` (reward, filter)
    OCCUPIED = 2  # holds an occupied slot, waiting for its buffer to be consumed


class AbortReason(IntEnum):
    """Why a group (or a child) was dropped. Every group that does not end consumed has one."""

    STALE = 0  # no unconsumed buffer of its window can take it any more
    NO_ROOM = 1  # redundant work completed but every buffer of its window was already full
    SURPLUS_CHILD = 2  # the group already has its N winners; this child is redundant
    FILTERED = 3  # dropped by the group filter (e.g. zero reward variance)
    FAILED = 4  # too many children failed for the group to reach N
    RETRY = 5  # proactive filter `retry`: straggler of the buffer the trainer waits on
    CANCELLED = 6  # the run (or the caller) cancelled it


class FinishVerdict(IntEnum):
    """What `finish_child` made of a finished child."""

    ACCEPTED = 0  # counted; the group still needs more children
    GROUP_COMPLETE = 1  # counted, and the group now has its N winners
    DUPLICATE = 2  # this child was already counted
    LATE = 3  # the child or its group was aborted or closed before it finished: discard it
    UNKNOWN = 4  # the ledger never saw this child reserve: discard it


class ChildRef(NamedTuple):
    """A child request of a group and the instance it was routed to (None: never routed)."""

    child: int
    instance: str | None


@dataclass(frozen=True)
class LedgerSizes:
    """The numbers the ledger is built from; `from_config` is the single source of truth.

    Units are prompt groups throughout (`staleness_buffer_entries` counts groups, not samples).
    """

    staleness: int  # eta
    num_slots: int  # B': slots per buffer (redundant_global_batch_size, or B)
    ready_entries: int  # B: occupied groups that make a buffer ready
    alg_rollout_n: int  # N: finished children that complete a group
    redundant_rollout_n: int  # N': children launched per group

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise LedgerError(f"staleness must be >= 0, got {self.staleness}")
        if not 1 <= self.ready_entries <= self.num_slots:
            raise LedgerError(f"need 1 <= ready_entries <= num_slots, got {self.ready_entries}, {self.num_slots}")
        if not 1 <= self.alg_rollout_n <= self.redundant_rollout_n:
            raise LedgerError(
                f"need 1 <= alg_rollout_n <= redundant_rollout_n, got {self.alg_rollout_n}, {self.redundant_rollout_n}"
            )

    @classmethod
    def from_config(cls, config: Config) -> LedgerSizes:
        return cls(
            staleness=config.psrl.staleness,
            num_slots=config.entries_per_buffer,
            ready_entries=config.psrl.staleness_buffer_entries,
            alg_rollout_n=config.psrl.rollout_n,
            redundant_rollout_n=config.responses_per_prompt,
        )


@dataclass(frozen=True)
class GroupAborted:
    """A group left the ledger without being consumed."""

    prompt_id: int
    reason: AbortReason
    children_to_abort: tuple[ChildRef, ...]  # unfinished children: stop them (or drop them from queues)


@dataclass(frozen=True)
class FinishOutcome:
    prompt_id: int
    child: int
    verdict: FinishVerdict
    winners: tuple[int, ...] = ()  # set when the group completed: its first N finished children
    surplus: tuple[ChildRef, ...] = ()  # set when the group completed: unfinished children, now aborted


@dataclass(frozen=True)
class ReservationMove:
    """A reservation moved by Occupy: to a later buffer of its window (the swap), or out of a stuck
    buffer that holds more reservations than it needs (`to_buffer` None: it floats, redundancy only)."""

    prompt_id: int
    from_buffer: int
    to_buffer: int | None


@dataclass(frozen=True)
class OccupyOutcome:
    prompt_id: int
    buffer_id: int | None  # None: no buffer of its window had room (the group is in `aborted`, NO_ROOM)
    is_buffer_ready: bool
    move: ReservationMove | None
    aborted: tuple[GroupAborted, ...] = ()  # groups this event made impossible to place


@dataclass(frozen=True)
class ConsumedGroup:
    prompt_id: int
    winner_versions: tuple[tuple[int, int], ...]  # (child, V_traj) of the N winners


@dataclass(frozen=True)
class ConsumedBuffer:
    buffer_id: int
    groups: tuple[ConsumedGroup, ...]  # in occupancy order
    staleness_histogram: dict[int, int]  # staleness (buffer_id - V_traj) -> trajectories
    num_bound_violations: int  # trajectories outside V_traj <= b <= V_traj + eta (a bug if ever > 0)


@dataclass(frozen=True)
class BufferCounts:
    buffer_id: int
    num_occupied: int
    num_reserved: int
    num_empty: int
    status: BufferStatus


@dataclass(frozen=True)
class LedgerCounts:
    """A snapshot for status events and metrics."""

    next_buffer_id: int  # the buffer the trainer consumes next
    num_in_flight: int
    num_complete: int
    num_occupied: int
    num_floating: int  # in-flight groups whose reserved buffer was consumed (batch redundancy only)
    buffers: tuple[BufferCounts, ...] = field(default_factory=tuple)
