"""The router's instance registry: one ``InstanceView`` per instance and the candidate list.

Routing reads the immutable ``CandidateState`` of every healthy instance on every decision,
while a decision changes only the instance it picks. The registry therefore keeps the healthy
instances' candidates in one list, in instance order, and replaces a single entry whenever that
instance changes, so gathering a decision's candidates is one C-level copy.
"""

from __future__ import annotations

from collections.abc import Iterator

from psrl.routing.instance import CandidateState, InstanceView


class Cluster:
    def __init__(self) -> None:
        self._views: dict[str, InstanceView] = {}
        self._healthy: list[CandidateState] = []
        self._position: dict[str, int] = {}  # instance id -> index in _healthy
        self._min_version = 0
        self._versions: tuple[int, ...] = ()  # distinct versions of healthy instances, ascending
        self.num_slots = 0  # instance orders handed out so far (round robin wraps on it)

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._views

    def __iter__(self) -> Iterator[InstanceView]:
        return iter(self._views.values())

    def add(self, instance_id: str, version: int, kv_capacity_tokens: int) -> InstanceView:
        if instance_id in self._views:
            raise ValueError(f"instance {instance_id} is already registered")
        view = InstanceView(instance_id, self.num_slots, version, kv_capacity_tokens)
        self.num_slots += 1
        self._views[instance_id] = view
        self._rebuild()
        return view

    def remove(self, instance_id: str) -> InstanceView:
        view = self.view(instance_id)
        del self._views[instance_id]
        self._rebuild()
        return view

    def view(self, instance_id: str) -> InstanceView:
        view = self._views.get(instance_id)
        if view is None:
            raise KeyError(f"unknown instance {instance_id}")
        return view

    def find(self, instance_id: str) -> InstanceView | None:
        return self._views.get(instance_id)

    def changed(self, view: InstanceView, *, health_or_version: bool = False) -> None:
        """Refresh the candidate of ``view`` after it changed."""
        view.touch()
        if health_or_version:
            self._rebuild()
            return
        position = self._position.get(view.instance_id)
        if position is not None:
            self._healthy[position] = view.candidate()

    def candidates(self, min_version: int) -> tuple[CandidateState, ...]:
        """Healthy instances whose version is >= ``min_version``, in instance order."""
        if min_version <= self._min_version:
            return tuple(self._healthy)
        return tuple(c for c in self._healthy if c.version >= min_version)

    @property
    def num_healthy(self) -> int:
        return len(self._healthy)

    def versions(self, min_version: int) -> tuple[int, ...]:
        """Distinct versions >= ``min_version`` among healthy instances, ascending."""
        if min_version <= self._min_version:
            return self._versions
        return tuple(v for v in self._versions if v >= min_version)

    def _rebuild(self) -> None:
        healthy = [v for v in self._views.values() if v.is_healthy]
        self._healthy = [v.candidate() for v in healthy]
        self._position = {v.instance_id: i for i, v in enumerate(healthy)}
        self._versions = tuple(sorted({c.version for c in self._healthy}))
        self._min_version = self._versions[0] if self._versions else 0
