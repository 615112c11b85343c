"""Where `psrl scale` starts a new rollout instance on a Ray run: in a rollout bundle that no instance holds.

The run's placement group is fixed when it starts (a Ray placement group cannot grow), so its
rollout bundles are the run's room: an instance added by `psrl scale` takes a bundle that a retired
instance left (its runner too: the runner keeps the bundle's resources), on that bundle's node.
Growing beyond the bundles reserved at launch is refused by the room, with the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from launch.hosts import Host, HostsFile


@dataclass
class RolloutBundles:
    """The rollout bundles and who holds each: pure bookkeeping, so the choice is testable without Ray."""

    holder: dict[int, str]  # bundle index -> the instance that runs (or last ran) in it
    exited: Callable[[str], bool]  # whether an instance's process has exited (its runner stays)
    inherited: dict[str, str] = field(default_factory=dict)  # new instance -> the one whose runner it takes

    def room(self) -> int:
        return len(self.holder)

    def take(self, name: str, active: list[str]) -> int | None:
        """A bundle for new instance ``name``: one whose holder left the set and has exited (None: none)."""
        for bundle, holder in sorted(self.holder.items()):
            if holder not in active and self.exited(holder):
                self.holder[bundle] = name
                self.inherited[name] = holder
                return bundle
        return None


@dataclass
class RayRolloutPlacement:
    """`launch.scale_placement.RolloutPlacement` over a Ray run's rollout bundles."""

    bundles: RolloutBundles
    hosts: HostsFile
    node_of_bundle: Callable[[int], str]
    bind: Callable[[str, int], None]  # tells the cluster which bundle an instance runs in

    def limit(self) -> int:
        return self.bundles.room()

    def host_for(self, index: int, active: list[str]) -> Host | None:
        name = f"rollout-{index}"
        bundle = self.bundles.take(name, active)
        if bundle is None:
            from launch.cluster.layout import ClusterError

            raise ClusterError(
                f"no rollout bundle of the Ray placement group is free for {name}; fix: scale down first, or "
                f"relaunch with more rollout instances (a placement group cannot grow)"
            )
        self.bind(name, bundle)
        node = self.node_of_bundle(bundle)
        return next(h for h in self.hosts.hosts if h.node_id == node)
