"""LoRA versions in the embedded engine: adapters merged on load onto the kept base, exactly the trainer's
merged model, each version onto the base (not the previous merge), and bad adapters refused whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from psrl.engine import Engine, EngineArgs
from psrl.engine.lora_merge import LoraServing
from psrl.models.lora import AdapterError
from psrl.trainer import TrainerCore
from psrl.trainer.lora import merged_state_dict
from tests.engine.conftest import Checkpoint, LogitRecorder, greedy, make_checkpoint, run_to_completion
from tests.trainer.trainer_helpers import make_buffer, trainer_config

ALPHA = 8.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOLERANCE = 1e-4


def _args(checkpoint: Checkpoint, lora: LoraServing | None) -> EngineArgs:
    return EngineArgs(model_path=checkpoint.path, dtype="float32", device="cpu", block_size=4, num_kv_blocks=64,
                      lora=lora)  # fmt: skip


def _engine_weights(engine: Engine) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in engine.runner.model.state_dict().items()}


def _merged_engine(checkpoint: Checkpoint, core: TrainerCore) -> Engine:
    """An engine started from the trainer's merged Hugging Face weights: the reference."""
    raw = core.policy.raw
    return Engine(_args(checkpoint, None), weights=merged_state_dict(raw, raw.state_dict()))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Checkpoint, TrainerCore, list[dict[str, torch.Tensor]]]:
    """A checkpoint, a LoRA trainer on it, and its adapters at versions 1 and 2."""
    checkpoint = make_checkpoint("qwen2_tied", tmp_path_factory.mktemp("lora_qwen2"))
    config = trainer_config([f"model.path={checkpoint.path}", "actor.lora.rank=4", f"actor.lora.alpha={ALPHA}"])
    core = TrainerCore(config)
    versions = []
    for buffer_id in (0, 1):
        core.train_buffer(buffer_id, make_buffer(buffer_id))
        versions.append({n: t.clone() for n, t in core.named_weights()})
    return checkpoint, core, versions


def test_a_merged_version_generates_the_lora_trainers_logits(trained: tuple[Checkpoint, TrainerCore, list]) -> None:
    checkpoint, core, versions = trained
    engine = Engine(_args(checkpoint, LoraServing(ALPHA, TARGETS)))
    engine.load_weights(list(versions[0].items()), version=1)
    engine.load_weights(list(versions[1].items()), version=2)
    reference = _merged_engine(checkpoint, core)
    expected = _engine_weights(reference)
    assert all(torch.equal(t, expected[n]) for n, t in _engine_weights(engine).items()), "merged onto the base"
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompt = [3, 14, 15, 9, 26]
    engine.add_request("0", prompt, greedy(max_tokens=6))
    output = run_to_completion(engine)[0]["0"].output_ids
    adapted = Checkpoint(checkpoint.name, checkpoint.path, core.policy.raw.eval())  # unmerged LoRA modules
    assert output == adapted.reference_greedy(prompt, len(output))
    assert recorder.max_error(adapted, "0", prompt + output) < TOLERANCE


def test_a_partial_load_merges_with_the_held_half(trained: tuple[Checkpoint, TrainerCore, list]) -> None:
    """Delta sync hands over only the tensors that changed: the other half of each pair is the one held."""
    checkpoint, _, versions = trained
    engine = Engine(_args(checkpoint, LoraServing(ALPHA, TARGETS)))
    engine.load_weights(list(versions[0].items()), version=1)
    only_b = [(n, t) for n, t in versions[1].items() if n.endswith("lora_B")]
    engine.load_weights(only_b, version=2)
    mixed = {**versions[0], **dict(only_b)}
    whole = Engine(_args(checkpoint, LoraServing(ALPHA, TARGETS)))
    whole.load_weights(list(mixed.items()), version=2)
    assert all(torch.equal(t, _engine_weights(whole)[n]) for n, t in _engine_weights(engine).items())


def test_bad_adapters_change_nothing(trained: tuple[Checkpoint, TrainerCore, list], tmp_path: Path) -> None:
    checkpoint, _, versions = trained
    engine = Engine(_args(checkpoint, LoraServing(ALPHA, ("q_proj", "v_proj"))))
    before = _engine_weights(engine)
    with pytest.raises(AdapterError, match="no targeted projection"):
        engine.load_weights(list(versions[0].items()), version=1)  # carries o_proj, mlp... adapters too
    first_half = [(n, t) for n, t in versions[0].items() if n.endswith("q_proj.lora_A")]
    with pytest.raises(AdapterError, match="never loaded"):
        engine.load_weights(first_half, version=1)
    name = next(n for n in versions[0] if n.endswith("q_proj.lora_B"))
    wrong = [(n, t) for n, t in versions[0].items() if "q_proj" in n]
    wrong = [(n, t[:, :1] if n == name else t) for n, t in wrong]
    with pytest.raises(AdapterError, match="do not fit"):
        engine.load_weights(wrong, version=1)
    assert engine.weight_version == 0
    assert all(torch.equal(t, before[n]) for n, t in _engine_weights(engine).items())
    plain = Engine(_args(checkpoint, None))
    with pytest.raises(AdapterError, match=r"without actor\.lora"):
        plain.load_weights(list(versions[0].items()), version=1)


def test_a_target_the_checkpoint_lacks_is_refused_at_start(trained: tuple[Checkpoint, TrainerCore, list]) -> None:
    checkpoint = trained[0]
    args = _args(checkpoint, LoraServing(ALPHA, ("q_proj", "w_in")))
    with pytest.raises(AdapterError, match=r"actor\.lora\.target_modules"):
        Engine(args)
