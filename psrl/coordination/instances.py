"""The coordinator's view of the rollout instances, from their status reports and sync events.

An instance removed from the set (``psrl scale``) is retired: it leaves the view at once and its
later reports, sent while it drains, do not bring it back, so no sync, migration or evaluation
is planned on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from psrl.coordination.state import InstanceState
from psrl.routing.instance import InstanceSnapshot


@dataclass
class _Instance:
    instance_id: str
    version: int
    is_syncing: bool = False
    stale_report_version: int = -1
    snapshot: InstanceSnapshot | None = None
    sync_started: float | None = None
    last_pull_s: float | None = None


class InstanceBook:
    def __init__(self) -> None:
        self._instances: dict[str, _Instance] = {}
        self._retired: set[str] = set()

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._instances

    def report(self, snapshot: InstanceSnapshot) -> None:
        if snapshot.instance_id in self._retired:
            return
        inst = self._instances.get(snapshot.instance_id)
        if inst is None:
            inst = self._instances[snapshot.instance_id] = _Instance(snapshot.instance_id, snapshot.model_version)
        if inst.snapshot is None or snapshot.seq > inst.snapshot.seq:
            inst.snapshot = snapshot
        if snapshot.model_version > inst.version:
            # a load whose WeightsLoaded this book never saw (published while its coordinator was down)
            inst.stale_report_version, inst.version = inst.version, snapshot.model_version
            inst.is_syncing = False

    def sync_started(self, instance_id: str, now: float) -> None:
        inst = self._instances.get(instance_id)
        if inst is not None:
            inst.is_syncing = True
            inst.sync_started = now

    def loaded(self, instance_id: str, version: int, pull_s: float) -> None:
        inst = self._instances.get(instance_id)
        if inst is None:
            return
        inst.stale_report_version = inst.version  # reports from before the sync describe old weights
        inst.version = version
        inst.is_syncing = False
        inst.last_pull_s = pull_s

    def sync_failed(self, instance_id: str) -> None:
        inst = self._instances.get(instance_id)
        if inst is not None:
            inst.is_syncing = False

    def remove(self, instance_id: str) -> None:
        self._instances.pop(instance_id, None)

    def retire(self, instance_id: str) -> None:
        """Out of the view for good (an instance name is never reused within a launch)."""
        self._retired.add(instance_id)
        self._instances.pop(instance_id, None)

    def states(self) -> tuple[InstanceState, ...]:
        return tuple(
            InstanceState(i.instance_id, i.version, i.is_syncing, i.stale_report_version, i.snapshot, i.last_pull_s)
            for i in sorted(self._instances.values(), key=lambda i: i.instance_id)
        )

    def versions(self) -> dict[str, int]:
        return {i.instance_id: i.version for i in self._instances.values()}
