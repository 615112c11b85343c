"""The group tracker: one live prompt group, its children and its place in the buffers.

A group is one prompt with N' children (responses). Its first N finished children win; the rest
are surplus. Children reserve one at a time, each at the version of the instance it was routed to.

Group version (open question 2 of the design digest, settled here):

* While in flight, the group's version `version` is the minimum over every child that ever
  reserved, aborted ones included. It only decreases (when an older child joins), never increases,
  so the reservation never has to move to a later buffer when a child is aborted. Using a lower
  version than strictly needed only narrows the window, which is always safe for the bound.
* When the group completes, `version` becomes the minimum over its N winners: only their
  trajectories are consumed, so only their versions bound where the group may land.
"""

from __future__ import annotations

from psrl.staleness.types import ChildRef, GroupState


class Group:
    """Mutable record of one live group; owned and mutated by the ledger only."""

    __slots__ = (
        "aborted",
        "buffer_id",
        "child_instances",
        "child_versions",
        "finished",
        "prompt_id",
        "state",
        "version",
        "winners",
    )

    def __init__(self, prompt_id: int, version: int, buffer_id: int) -> None:
        self.prompt_id = prompt_id
        self.state = GroupState.IN_FLIGHT
        self.version = version
        self.buffer_id: int | None = buffer_id  # reserved buffer, or occupied once OCCUPIED; None = floating
        self.child_versions: dict[int, int] = {}
        self.child_instances: dict[int, str] = {}
        self.finished: list[int] = []
        self.aborted: set[int] = set()
        self.winners: tuple[int, ...] = ()

    def add_child(self, child: int, version: int, instance: str) -> None:
        self.child_versions[child] = version
        self.child_instances[child] = instance
        self.version = min(self.version, version)

    def running_children(self) -> list[int]:
        """Children that reserved and have neither finished nor been aborted, in reservation order."""
        return [c for c in self.child_versions if c not in self.aborted and c not in self.finished]

    def open_children(self, num_children: int) -> tuple[ChildRef, ...]:
        """Every child (routed or not) that has neither finished nor been aborted."""
        done = self.aborted.union(self.finished)
        return tuple(ChildRef(c, self.child_instances.get(c)) for c in range(num_children) if c not in done)

    def num_viable_children(self, num_children: int) -> int:
        """Children that may still finish, plus the finished ones."""
        return num_children - len(self.aborted)

    def complete(self, winners: tuple[int, ...]) -> None:
        self.winners = winners
        self.state = GroupState.COMPLETE
        self.version = min(self.child_versions[c] for c in winners)

    def winner_versions(self) -> tuple[tuple[int, int], ...]:
        return tuple((c, self.child_versions[c]) for c in self.winners)
