"""A replacement trainer rank continues from the weights the parameter server committed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from psrl.trainer import TrainerCore, TrainerError

from .trainer_helpers import make_buffer, trainer_config


def test_adopted_weights_continue_the_numbering_exactly_where_the_ps_is(tiny_model_dir: Path) -> None:
    ahead = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
    for buffer in range(2):
        ahead.train_buffer(buffer, make_buffer(buffer))
    published = {name: tensor.clone() for name, tensor in ahead.named_weights()}
    replacement = TrainerCore(trainer_config(), model_dir=tiny_model_dir)  # no checkpoint: version 0
    replacement.adopt_weights(2, published)
    assert replacement.version == 2
    got = dict(replacement.named_weights())
    assert all(torch.equal(got[name], published[name]) for name in published)
    result = replacement.train_buffer(2, make_buffer(2))
    assert result.version == 3  # the next version, never one the PS already holds


def test_weights_missing_a_tensor_or_a_half_trained_buffer_are_refused(tiny_model_dir: Path) -> None:
    core = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
    partial = dict(list(core.named_weights())[1:])
    with pytest.raises(TrainerError, match="lacks 1 policy tensors"):
        core.adopt_weights(3, partial)
    assert core.version == 0
