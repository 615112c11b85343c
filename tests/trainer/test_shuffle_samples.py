"""`actor.shuffle_samples`: a buffer's samples dealt into its mini-batches at random (seeded), instead of
whole prompt groups in arrival order."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from psrl.config import load_config
from psrl.errors import ConfigError
from psrl.trainer import TrainerCore
from psrl.trainer import core as core_module
from psrl.trainer.dealing import dealt_mini_batches

from .trainer_helpers import make_buffer, trainer_config

GROUPS = [[f"g{g}s{s}" for s in range(8)] for g in range(16)]


def test_dealt_mini_batches_are_a_seeded_permutation_in_as_many_parts() -> None:
    parts = dealt_mini_batches(GROUPS, 4, seed=0, buffer_id=3, epoch=0)
    assert len(parts) == 4 and {len(p) for p in parts} == {32}
    assert sorted(s for p in parts for s in p) == sorted(s for g in GROUPS for s in g)
    groups_per_part = [len({s.split("s")[0] for s in p}) for p in parts]
    assert min(groups_per_part) > 4, groups_per_part  # each step sees answers to more prompts than 4 groups hold
    assert parts == dealt_mini_batches(GROUPS, 4, seed=0, buffer_id=3, epoch=0)
    for other in ({"seed": 1}, {"buffer_id": 4}, {"epoch": 1}, {"rank": 1}):
        arguments = {"seed": 0, "buffer_id": 3, "epoch": 0, **other}
        assert dealt_mini_batches(GROUPS, 4, **arguments) != parts, other  # type: ignore[arg-type]


def test_uneven_buffers_split_within_one_sample() -> None:
    groups = [[f"g{g}s{s}" for s in range(3)] for g in range(5)]  # 15 samples, 3 mini-batches of 2 groups
    sizes = sorted(len(p) for p in dealt_mini_batches(groups, 2, seed=-7, buffer_id=0, epoch=2))
    assert sizes == [5, 5, 5]
    assert dealt_mini_batches([], 2, seed=0, buffer_id=0, epoch=0) == []
    assert len(dealt_mini_batches(groups, 4, seed=0, buffer_id=0, epoch=0)) == 2  # as many as whole groups make


def _steps_seen(monkeypatch: pytest.MonkeyPatch) -> list[Counter[int]]:
    """The prompts of each optimizer step's samples (how many samples of each)."""
    seen: list[Counter[int]] = []
    real = core_module.actor_step

    def recording(policy: object, own: list[object], *args: object, **kwargs: object) -> None:
        seen.append(Counter(s.trajectory.prompt_id for s in own))  # type: ignore[attr-defined]
        real(policy, own, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(core_module, "actor_step", recording)
    return seen


def _train(model_dir: Path, overrides: list[str], seen: list[Counter[int]]) -> TrainerCore:
    base = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "actor.ppo_mini_batch_size=2"]
    core = TrainerCore(trainer_config([*base, *overrides]), model_dir=model_dir)
    for buffer_id in range(2):
        metrics = core.train_buffer(buffer_id, make_buffer(buffer_id, num_groups=8, group_size=4)).metrics
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    return core


def test_the_trainer_deals_samples_across_groups_when_asked(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _steps_seen(monkeypatch)
    _train(tiny_model_dir, [], seen)
    assert len(seen) == 8 and all(len(step) == 2 and set(step.values()) == {4} for step in seen)
    seen.clear()
    shuffled = _train(tiny_model_dir, ["actor.shuffle_samples=true"], seen)
    assert len(seen) == 8 and all(sum(step.values()) == 8 for step in seen)
    assert max(len(step) for step in seen) > 2  # a step mixes the answers of more than two prompts
    for first in range(0, 8, 4):  # every sample of a buffer is trained exactly once
        assert sum(seen[first : first + 4], Counter()) == Counter(
            {p: 4 for p in seen[first] | seen[first + 1] | seen[first + 2] | seen[first + 3]}
        )
    assert shuffled.version == 2


def test_shuffled_steps_replay_exactly(tiny_model_dir: Path) -> None:
    first, second = (_train(tiny_model_dir, ["actor.shuffle_samples=true"], []) for _ in range(2))
    for (name, a), (_, b) in zip(first.named_weights(), second.named_weights(), strict=True):
        assert torch.equal(a, b), name


def test_shuffling_turns_the_fused_forward_off_and_refuses_pre_step() -> None:
    assert trainer_config(["actor.shuffle_samples=true"]).actor.fuse_old_log_probs == "auto"
    with pytest.raises(ConfigError, match=r"actor\.shuffle_samples"):
        trainer_config(["actor.shuffle_samples=true", "actor.fuse_old_log_probs=true"])
    with pytest.raises(ConfigError, match=r"nothing to deal"):  # a setting that would change nothing is refused
        trainer_config(["actor.shuffle_samples=true", "actor.ppo_mini_batch_size=4"])
    with pytest.raises(ConfigError, match=r"overlap_scope=recompute"):
        load_config("demo", ["actor.shuffle_samples=true", "psrl.fine_grain_overlap.granularity=mini_batch",
                             "psrl.fine_grain_overlap.overlap_scope=pre_step"])  # fmt: skip
