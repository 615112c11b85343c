"""The trainer core on a real (tiny) transformers model: updates, overlap modes, checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from psrl.config.rules import check
from psrl.errors import ConfigError
from psrl.rl.batch import Sample
from psrl.rl.trajectory import Trajectory
from psrl.trainer import TrainerCore, TrainerError, latest_checkpoint
from psrl.trainer import core as core_module

from .trainer_helpers import make_buffer, trainer_config


def weights(core: TrainerCore) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in core.named_weights()}


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"parameters differ: {different[:4]}"


class TestTrainBuffer:
    def test_one_buffer_makes_one_version(self, tiny_model_dir: Path) -> None:
        core = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
        before = weights(core)
        assert "lm_head.weight" not in before  # tied to the embedding: pushed once
        result = core.train_buffer(0, make_buffer(0))
        assert (result.buffer_id, result.version, result.is_push_ready) == (0, 1, True)
        assert core.version == 1
        after = weights(core)
        assert any(not torch.equal(before[n], after[n]) for n in before)
        for key in (
            "reward/mean",
            "acc/mean",
            "actor/pg_loss",
            "actor/clip_frac",
            "actor/entropy",
            "actor/grad_norm",
            "rollout_is/mean",
            "rollout_is/max",
            "rollout_is/truncated_frac",
            "staleness/hist/0",
            "staleness/bound_violations",
            "perf/tokens_per_s",
        ):
            assert key in result.metrics, key
        assert result.metrics["staleness/bound_violations"] == 0.0
        assert result.metrics["buffer/num_trajectories"] == 8.0

    def test_gradient_checkpointing_trains_the_same_weights(self, tiny_model_dir: Path) -> None:
        plain = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
        checkpointed = TrainerCore(trainer_config(["actor.gradient_checkpointing=True"]), model_dir=tiny_model_dir)
        calls = 0

        def counted(checkpoint: Callable[..., object]) -> Callable[..., object]:
            def count(*args: object, **kwargs: object) -> object:
                nonlocal calls
                calls += 1
                return checkpoint(*args, **kwargs)

            return count

        layers = [m for m in checkpointed.policy.model.modules() if getattr(m, "gradient_checkpointing", False)]
        assert layers
        for layer in layers:
            layer._gradient_checkpointing_func = counted(layer._gradient_checkpointing_func)
        for buffer_id in range(2):
            expected = plain.train_buffer(buffer_id, make_buffer(buffer_id))
            result = checkpointed.train_buffer(buffer_id, make_buffer(buffer_id))
            assert result.metrics["actor/pg_loss"] == pytest.approx(expected.metrics["actor/pg_loss"], abs=1e-6)
        assert calls > 0  # the layers were recomputed, not run as usual
        # no dropout came on with it: the policy's log-probs are those of the eval-mode model
        assert not any(m.training for m in checkpointed.policy.model.modules() if isinstance(m, torch.nn.Dropout))
        for name, tensor in weights(plain).items():
            torch.testing.assert_close(weights(checkpointed)[name], tensor, rtol=1e-5, atol=1e-6)

    def test_bf16_compute_keeps_fp32_parameters(self, tiny_model_dir: Path) -> None:
        plain = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
        mixed = TrainerCore(trainer_config(["actor.compute_dtype=bfloat16"]), model_dir=tiny_model_dir)
        seen: set[torch.dtype] = set()
        layer = next(m for m in mixed.policy.model.modules() if isinstance(m, torch.nn.Linear))
        layer.register_forward_hook(lambda module, args, output: seen.add(output.dtype))
        expected = plain.train_buffer(0, make_buffer(0))
        result = mixed.train_buffer(0, make_buffer(0))
        assert seen == {torch.bfloat16}  # every forward of the step ran under autocast
        assert all(p.dtype == torch.float32 for p in mixed.policy.model.parameters())
        assert result.metrics["actor/pg_loss"] == pytest.approx(expected.metrics["actor/pg_loss"], abs=2e-2)
        moved = [n for n, t in weights(mixed).items() if not torch.equal(t, weights(plain)[n])]
        assert moved  # bf16 arithmetic: not the fp32 step bit for bit, but a step

    def test_staleness_histogram(self, tiny_model_dir: Path) -> None:
        core = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
        core.train_buffer(0, make_buffer(0))
        result = core.train_buffer(1, make_buffer(2))  # versions 1 in buffer 1: staleness 0
        assert result.metrics["staleness/hist/0"] == 8.0
        result = core.train_buffer(2, make_buffer(1))  # version 0 in buffer 2: staleness 2 > eta 1
        assert result.metrics["staleness/hist/2"] == 8.0
        assert result.metrics["staleness/bound_violations"] == 8.0

    def test_refuses_wrong_buffer_and_bad_groups(self, tiny_model_dir: Path) -> None:
        core = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
        with pytest.raises(TrainerError, match="consumes buffer 0"):
            core.train_buffer(1, make_buffer(1))
        with pytest.raises(TrainerError, match="must have 2 trajectories"):
            core.train_buffer(0, make_buffer(0)[:-1])
        no_log_probs = [_without_log_probs(t) for t in make_buffer(0)]
        with pytest.raises(TrainerError, match="engine's log-probs"):
            core.train_buffer(0, no_log_probs)
        with pytest.raises(TrainerError, match=r"no config\.json"):
            TrainerCore(trainer_config(), model_dir=tiny_model_dir / "missing")

    def test_kl_to_reference_starts_at_zero(self, tiny_model_dir: Path) -> None:
        one_step = ["actor.ppo_mini_batch_size=4", "algorithm.kl_loss_coef=0.1", "algorithm.kl_loss_type=low_var_kl"]
        config = trainer_config(one_step)
        core = TrainerCore(config, model_dir=tiny_model_dir)
        first = core.train_buffer(0, make_buffer(0)).metrics
        assert first["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at the first step
        second = core.train_buffer(1, make_buffer(1)).metrics
        assert second["actor/kl_loss"] > 0.0

    def test_bypass_mode_uses_engine_log_probs(self, tiny_model_dir: Path) -> None:
        config = trainer_config(["algorithm.rollout_correction.bypass_mode=true"])
        core = TrainerCore(config, model_dir=tiny_model_dir)
        metrics = core.train_buffer(0, make_buffer(0)).metrics
        assert metrics["rollout/log_prob_abs_diff"] == 0.0  # old log-probs are the engine's
        assert "rollout_is/mean" not in metrics
        assert metrics["actor/clip_frac"] > 0.0  # the tiny model is far from the synthetic engine

    @pytest.mark.parametrize("estimator", ["gae", "reinforce_plus_plus"])
    def test_other_estimators(self, tiny_model_dir: Path, estimator: str) -> None:
        one_step = [f"algorithm.adv_estimator={estimator}", "actor.ppo_mini_batch_size=4"]
        core = TrainerCore(trainer_config(one_step), model_dir=tiny_model_dir)
        metrics = core.train_buffer(0, make_buffer(0)).metrics
        assert core.version == 1
        if estimator == "gae":
            assert core.critic is not None
            assert metrics["critic/values_mean"] == 0.0  # zero-initialised value head
            assert metrics["critic/grad_norm"] > 0.0
            assert core.train_buffer(1, make_buffer(1)).metrics["critic/values_mean"] != 0.0


class TestFineGrainOverlap:
    @pytest.mark.parametrize(
        ("granularity", "chunk_groups", "micro"),
        [
            ("mini_batch", 2, 2),
            ("micro_batch", 1, 2),
            ("mini_batch", 3, 2),
            ("mini_batch", 3, 4),
            ("micro_batch", 1, 4),
        ],
    )
    def test_recompute_is_bit_identical_to_none(
        self, tiny_model_dir: Path, granularity: str, chunk_groups: int, micro: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Forward units of micro // rollout_n groups must not depend on where the chunks were cut."""
        units: list[tuple[int, ...]] = []
        real_stage = core_module.run_forwards

        def recording_stage(samples: list[Sample], *args: object, **kwargs: object) -> object:
            units.append(tuple(s.trajectory.prompt_id for s in samples))
            return real_stage(samples, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(core_module, "run_forwards", recording_stage)
        sizes = [f"actor.ppo_micro_batch_size_per_gpu={micro}"]
        reference = TrainerCore(trainer_config(sizes), model_dir=tiny_model_dir)
        chunked = TrainerCore(
            trainer_config([*sizes, f"psrl.fine_grain_overlap.granularity={granularity}"]), model_dir=tiny_model_dir
        )
        for buffer_id in range(2):
            buffer = make_buffer(buffer_id)
            expected = reference.train_buffer(buffer_id, buffer)
            reference_units, units[:] = list(units), []
            chunks = [buffer[i : i + 2 * chunk_groups] for i in range(0, len(buffer), 2 * chunk_groups)]
            results = [chunked.add_chunk(buffer_id, c, is_last=i == len(chunks) - 1) for i, c in enumerate(chunks)]
            assert all(r is None for r in results[:-1])
            final = results[-1]
            assert final is not None and final.is_push_ready and final.version == expected.version
            assert final.metrics["actor/pg_loss"] == expected.metrics["actor/pg_loss"]
            assert units == reference_units  # same forward batches, whatever the chunking
            units.clear()
        assert_identical(weights(reference), weights(chunked))

    def test_pre_step_equals_per_chunk_updates(self, tiny_model_dir: Path) -> None:
        pre_step = TrainerCore(
            trainer_config(
                ["psrl.fine_grain_overlap.granularity=mini_batch", "psrl.fine_grain_overlap.overlap_scope=pre_step"]
            ),
            model_dir=tiny_model_dir,
        )
        by_hand = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
        buffer = make_buffer(0)
        first, second = buffer[:4], buffer[4:]  # two chunks of 2 groups = one mini-batch each
        intermediate = pre_step.add_chunk(0, first, is_last=False)
        assert intermediate is not None and not intermediate.is_push_ready and intermediate.version == 0
        final = pre_step.add_chunk(0, second, is_last=True)
        assert final is not None and final.is_push_ready and final.version == 1
        by_hand.train_buffer(0, first)  # each chunk as its own one-mini-batch step
        by_hand.train_buffer(1, [_rebuffer(t, 1) for t in second])
        assert_identical(weights(pre_step), weights(by_hand))

    def test_pre_step_train_buffer_splits_into_chunks(self, tiny_model_dir: Path) -> None:
        config = trainer_config(
            ["psrl.fine_grain_overlap.granularity=mini_batch", "psrl.fine_grain_overlap.overlap_scope=pre_step"]
        )
        core = TrainerCore(config, model_dir=tiny_model_dir)
        assert core.train_buffer(0, make_buffer(0)).version == 1
        with pytest.raises(TrainerError, match="one mini-batch per chunk"):
            core.add_chunk(1, make_buffer(1)[:2], is_last=False)

    @pytest.mark.parametrize(
        "overrides",
        [
            ["psrl.fine_grain_overlap.granularity=micro_batch"],
            ["psrl.fine_grain_overlap.granularity=mini_batch", "actor.ppo_epochs=2"],
        ],
    )
    def test_pre_step_refusals_match_config_rules(self, tiny_model_dir: Path, overrides: list[str]) -> None:
        config = trainer_config(overrides)
        config.psrl.fine_grain_overlap.overlap_scope = "pre_step"  # load_config would already refuse it
        expected = [p for p in check(config) if "psrl.fine_grain_overlap.overlap_scope" in p.paths]
        assert expected
        with pytest.raises(ConfigError) as info:
            TrainerCore(config, model_dir=tiny_model_dir)
        assert [p.render() for p in info.value.problems] == [p.render() for p in expected]


class TestCheckpoint:
    @pytest.mark.parametrize("estimator", ["grpo", "gae"])
    def test_resume_continues_bit_identically(self, tiny_model_dir: Path, tmp_path: Path, estimator: str) -> None:
        config = trainer_config([f"algorithm.adv_estimator={estimator}"])
        original = TrainerCore(config, model_dir=tiny_model_dir)
        original.train_buffer(0, make_buffer(0))
        saved = original.save_checkpoint(tmp_path)
        assert latest_checkpoint(tmp_path) == saved
        assert (saved / "policy" / "config.json").exists()  # Hugging Face layout: the engine can load it
        original.train_buffer(1, make_buffer(1))

        resumed = TrainerCore(config, model_dir=tiny_model_dir)
        assert resumed.load_checkpoint(saved) == 1
        result = resumed.train_buffer(1, make_buffer(1))
        assert result.version == 2 == original.version
        assert_identical(weights(original), weights(resumed))
        if estimator == "gae":
            assert original.critic is not None and resumed.critic is not None
            a, b = original.critic.raw.state_dict(), resumed.critic.raw.state_dict()
            assert all(torch.equal(a[k], b[k]) for k in a)

    def test_latest_picks_highest_complete_version(self, tiny_model_dir: Path, tmp_path: Path) -> None:
        core = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
        core.save_checkpoint(tmp_path)
        core.train_buffer(0, make_buffer(0))
        newest = core.save_checkpoint(tmp_path)
        (tmp_path / "step_00000009.tmp").mkdir()  # a torn write is never picked
        assert latest_checkpoint(tmp_path) == newest
        assert latest_checkpoint(tmp_path / "nothing") is None

    def test_no_checkpoint_in_the_middle_of_a_buffer(self, tiny_model_dir: Path, tmp_path: Path) -> None:
        core = TrainerCore(trainer_config(["psrl.fine_grain_overlap.granularity=mini_batch"]), model_dir=tiny_model_dir)
        core.add_chunk(0, make_buffer(0)[:4], is_last=False)
        with pytest.raises(TrainerError, match="half-trained"):
            core.save_checkpoint(tmp_path)


def _without_log_probs(t: Trajectory) -> Trajectory:
    return Trajectory(**{**_fields(t), "rollout_log_probs": ()})


def _rebuffer(t: Trajectory, version: int) -> Trajectory:
    return Trajectory(**{**_fields(t), "version": version, "token_versions": tuple(version for _ in t.token_versions)})


def _fields(t: Trajectory) -> dict[str, object]:
    return {name: getattr(t, name) for name in t.__dataclass_fields__}
