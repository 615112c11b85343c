"""GPU placement: trainer ranks and rollout instances see the GPUs the topology gives them."""

from __future__ import annotations

import pytest

from launch.placement import visible_gpus
from psrl.config import load_config
from psrl.errors import ConfigError


def test_without_placement_every_process_sees_every_gpu() -> None:
    topology = load_config("demo", []).topology
    assert visible_gpus("trainer", 0, topology) is None
    assert visible_gpus("rollout", 3, topology) is None


def test_ranks_get_their_own_gpu_and_instances_share_the_rollout_gpus() -> None:
    config = load_config("demo", ["topology.device=cuda", "topology.n_trainer_ranks=2",
                                  "topology.trainer_gpus=[0,1]", "topology.rollout_gpus=[2,3]",
                                  "topology.n_rollout_instances=3"])  # fmt: skip
    topology = config.topology
    assert [visible_gpus("trainer", r, topology) for r in range(2)] == ["0", "1"]
    assert [visible_gpus("rollout", i, topology) for i in range(3)] == ["2", "3", "2"]
    assert visible_gpus("ps", 0, topology) is None
    assert visible_gpus("router", 0, topology) is None


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["topology.device=cpu", "topology.rollout_gpus=[1]"], "topology.device"),
        (["topology.device=cuda", "topology.n_trainer_ranks=2", "topology.trainer_gpus=[0]"], "n_trainer_ranks"),
        (["topology.device=cuda", "topology.n_trainer_ranks=2", "topology.trainer_gpus=[1,1]"], "trainer_gpus"),
        (["topology.device=cuda", "topology.rollout_gpus=[-1]"], "cannot be negative"),
    ],
)
def test_impossible_placements_are_refused_with_the_fix(overrides: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config("demo", overrides)
    assert named in str(error.value)


def test_the_supervisor_hands_the_placement_to_the_actor_in_its_boot_options() -> None:
    from launch.plan import ActorSpec
    from launch.supervisor import _placement

    config = load_config("demo", ["topology.device=cuda", "topology.rollout_gpus=[1]"])
    assert _placement(ActorSpec("rollout-0", "rollout", 0, None), config) == {"cuda_visible_devices": "1"}
    assert _placement(ActorSpec("trainer-0", "trainer", 0, None), config) == {}
