"""The trainer's warm-up: the compiled graphs built on a synthetic buffer, and nothing else changed."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from psrl.trainer import TrainerCore, core
from psrl.trainer.compiled import compile_layers
from psrl.trainer.warm_up import synthetic_buffer, warm_up_enabled

from .trainer_helpers import make_buffer, trainer_config

OVERRIDES = ["actor.gradient_checkpointing=True", "algorithm.entropy_coeff=0.01", "task.max_response_length=12"]


def _weights(trainer: TrainerCore) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in trainer.policy.raw.state_dict().items()}


def test_a_warmed_up_trainer_trains_exactly_as_one_that_was_not(tiny_model_dir: Path) -> None:
    warmed = TrainerCore(trainer_config(OVERRIDES), model_dir=tiny_model_dir)
    before = _weights(warmed)
    streams = (random.random(), np.random.random(), torch.rand(1))
    random.seed(0), np.random.seed(0), torch.manual_seed(0)  # the warm-up must hand these back as it found them
    assert warmed.warm_up() > 0
    assert (random.random(), np.random.random(), torch.rand(1)) != streams
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    assert (warmed.version, warmed.next_prompt_id, warmed.policy.optimizer.state) == (0, 0, {})
    assert all(p.grad is None for p in warmed.policy.raw.parameters())
    for name, tensor in _weights(warmed).items():
        assert torch.equal(tensor, before[name]), name
    cold = TrainerCore(trainer_config(OVERRIDES), model_dir=tiny_model_dir)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    for buffer in range(2):
        a, b = warmed.train_buffer(buffer, make_buffer(buffer)), cold.train_buffer(buffer, make_buffer(buffer))
        assert a.version == b.version == buffer + 1
        assert a.metrics["actor/pg_loss"] == b.metrics["actor/pg_loss"]
    for name, tensor in _weights(warmed).items():
        assert torch.equal(tensor, _weights(cold)[name]), name


def test_the_warm_up_builds_what_the_first_real_buffer_runs(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._dynamo.utils import counters

    # aot_eager traces as inductor would (forward, no-grad forward, backward through checkpointed layers)
    monkeypatch.setattr(core, "compile_layers", partial(compile_layers, backend="aot_eager"))
    torch._dynamo.reset()
    counters.clear()
    trainer = TrainerCore(trainer_config([*OVERRIDES, "actor.compile=True"]), model_dir=tiny_model_dir)
    trainer.warm_up()
    built = counters["stats"]["unique_graphs"]
    assert built > 0
    for buffer in range(2):
        trainer.train_buffer(buffer, make_buffer(buffer))
    assert counters["stats"]["unique_graphs"] == built  # nothing left for the real steps to build


def test_synthetic_buffer_has_the_runs_shape() -> None:
    buffer = synthetic_buffer(groups=4, group_size=3, max_prompt_tokens=8, max_response_tokens=20, vocab_size=48,
                              version=5)  # fmt: skip
    assert len(buffer) == 12 and {t.prompt_id for t in buffer} == {0, 1, 2, 3}
    lengths = [t.num_response_tokens for t in buffer]
    assert min(lengths) >= 1 and max(lengths) == 20 and len(set(lengths)) > 6
    assert all(1 <= len(t.prompt_token_ids) <= 8 and t.version == 5 for t in buffer)
    assert len({len(t.prompt_token_ids) for t in buffer}) > 1
    assert all(int(t.response_token_ids.max()) < 48 for t in buffer)
    for group in range(4):  # rewards differ within every group: advantages (and the loss) are not all zero
        assert len({t.reward for t in buffer if t.prompt_id == group}) == 2
    full = synthetic_buffer(groups=2, group_size=2, max_prompt_tokens=8, max_response_tokens=20, vocab_size=48,
                            version=0, full_length=True)  # fmt: skip
    assert [t.num_response_tokens for t in full] == [20] * 4


def test_auto_warms_up_a_compiling_trainer_alone_with_its_memory_resident() -> None:
    assert warm_up_enabled("auto", compiles=True, world_size=1, memory_managed=False)
    assert not warm_up_enabled("auto", compiles=False, world_size=1, memory_managed=False)
    assert not warm_up_enabled("auto", compiles=True, world_size=2, memory_managed=False)
    assert not warm_up_enabled("auto", compiles=True, world_size=1, memory_managed=True)
    assert warm_up_enabled(True, compiles=False, world_size=1, memory_managed=False)
    assert not warm_up_enabled(False, compiles=True, world_size=1, memory_managed=False)


def test_a_failed_warm_up_leaves_the_trainer_as_it_found_it(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = TrainerCore(trainer_config(OVERRIDES), model_dir=tiny_model_dir)
    optimizer, before = trainer.policy.optimizer, _weights(trainer)

    def fail_after_the_forwards(buffer_id: int, trajectories: list) -> None:
        trainer._state_for(buffer_id)  # half-way through a buffer, as an out-of-memory error would leave it
        raise torch.cuda.OutOfMemoryError("synthetic")

    monkeypatch.setattr(trainer, "train_buffer", fail_after_the_forwards)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        trainer.warm_up()
    assert trainer.policy.optimizer is optimizer and trainer.version == 0 and not trainer.has_partial_buffer
    for name, tensor in _weights(trainer).items():
        assert torch.equal(tensor, before[name]), name
    monkeypatch.undo()
    assert trainer.train_buffer(0, make_buffer(0)).version == 1  # and it trains the first real buffer


def test_a_buffer_arriving_during_the_warm_up_waits_for_it(tiny_model_dir: Path) -> None:
    """The actor's thread may get its first buffer while the warm-up's thread still trains the synthetic one:
    the two never run the model at once, and the real step comes out as without a warm-up."""
    import threading

    warmed = TrainerCore(trainer_config(OVERRIDES), model_dir=tiny_model_dir)
    cold = TrainerCore(trainer_config(OVERRIDES), model_dir=tiny_model_dir)
    inside, release = threading.Event(), threading.Event()
    train_buffer = warmed.train_buffer

    def slow_synthetic_buffer(buffer_id: int, trajectories: list) -> object:
        inside.set()
        release.wait(5)
        return train_buffer(buffer_id, trajectories)

    warmed.train_buffer = slow_synthetic_buffer  # type: ignore[method-assign]
    worker = threading.Thread(target=warmed.warm_up)
    worker.start()
    assert inside.wait(5)
    warmed.train_buffer = train_buffer  # type: ignore[method-assign]
    real = threading.Thread(target=lambda: results.append(warmed.add_chunk(0, make_buffer(0), is_last=True)))
    results: list = []
    real.start()
    real.join(0.3)
    assert real.is_alive()  # held while the warm-up holds the models
    release.set()
    worker.join(10), real.join(10)
    assert (
        results[0].version == 1
        and results[0].metrics["actor/pg_loss"] == cold.train_buffer(0, make_buffer(0)).metrics["actor/pg_loss"]
    )
    for name, tensor in _weights(warmed).items():
        assert torch.equal(tensor, _weights(cold)[name]), name
