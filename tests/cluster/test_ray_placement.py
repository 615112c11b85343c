"""Which rollout bundle of a Ray run an instance added by `psrl scale` takes (pure bookkeeping)."""

from __future__ import annotations

import pytest

from launch.cluster.layout import ClusterError
from launch.cluster.ray_placement import RayRolloutPlacement, RolloutBundles
from launch.hosts import Host, HostsFile


def bundles(exited: set[str]) -> RolloutBundles:
    return RolloutBundles({3: "rollout-0", 4: "rollout-1"}, lambda name: name in exited)


def test_an_added_instance_takes_the_bundle_a_retired_one_left_and_its_runner() -> None:
    book = bundles(exited={"rollout-1"})
    assert book.room() == 2
    assert book.take("rollout-2", active=["rollout-0"]) == 4
    assert book.inherited == {"rollout-2": "rollout-1"} and book.holder[4] == "rollout-2"


def test_a_bundle_is_not_taken_while_its_instance_serves_drains_or_may_restart() -> None:
    assert bundles(exited=set()).take("rollout-2", active=["rollout-0"]) is None  # rollout-1 still draining
    assert bundles(exited={"rollout-1"}).take("rollout-2", active=["rollout-0", "rollout-1"]) is None  # restarting


def test_the_placement_answers_the_node_of_the_bundle_and_binds_it() -> None:
    hosts = HostsFile("ray", (Host("launcher", "10.0.0.1", {}, is_local=True),
                              Host("ray-a", "10.0.0.2", {"rollout": 1}, starter="ray", node_id="a"),
                              Host("ray-b", "10.0.0.3", {"rollout": 1}, starter="ray", node_id="b")))  # fmt: skip
    bound: dict[str, int] = {}
    place = RayRolloutPlacement(bundles(exited={"rollout-0"}), hosts, {3: "a", 4: "b"}.__getitem__, bound.__setitem__)
    assert place.limit() == 2
    host = place.host_for(2, active=["rollout-1"])
    assert host is not None and host.name == "ray-a" and bound == {"rollout-2": 3}
    with pytest.raises(ClusterError, match=r"no rollout bundle .* is free for rollout-3"):
        place.host_for(3, active=["rollout-1", "rollout-2"])
