"""Unmerged LoRA in the embedded engine (engine.lora_mode=unmerged): the base weights stay as loaded and the
projections add the adapters' matmuls. Same greedy tokens and logits (fp32 rounding) as merge mode on every
decode path, version switches and half-pair (delta) loads as in merge mode, bad adapters refused whole."""

from __future__ import annotations

import pytest
import torch

from psrl.config import load_config
from psrl.engine import Engine, EngineArgs
from psrl.engine.lora_merge import LoraServing
from psrl.models import iter_safetensors
from psrl.models.lora import AdapterError, adapter_names
from tests.engine.conftest import Checkpoint, LogitRecorder, greedy, make_checkpoint, run_to_completion

RANK = 4
ALPHA = 8.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOLERANCE = 1e-4
PROMPTS = {"a": [3, 14, 15, 9, 26], "b": [5, 35, 8, 97 - 1, 32, 38, 4, 6]}
# decode paths of the CPU engine: fused kernels (where they build), eager dense, the graphs' bucketed shapes,
# and the step-kernel rounds run with the torch reference kernels
PATHS = {
    "default": {},
    "eager": {"cpu_kernels": "off"},
    "bucketed": {"cpu_kernels": "off", "bucketed_decode": True},
    "rounds": {"cpu_kernels": "off", "gpu_kernels": "torch", "decode_steps": 4},
}


def _version(checkpoint: Checkpoint, seed: int, targets: tuple[str, ...] = TARGETS) -> dict[str, torch.Tensor]:
    """Adapters for every targeted projection, large enough to change the model's greedy tokens."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, weight in iter_safetensors(checkpoint.path):
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rpartition(".")[2] in targets:
            lora_a, lora_b = adapter_names(module)
            out[lora_a] = torch.randn(RANK, weight.shape[1], generator=gen) * 0.3
            out[lora_b] = torch.randn(weight.shape[0], RANK, generator=gen) * 0.3
    return out


def _engine(checkpoint: Checkpoint, mode: str, targets: tuple[str, ...] = TARGETS, **extra: object) -> Engine:
    lora = LoraServing(ALPHA, targets, rank=RANK, mode=mode)  # type: ignore[arg-type]
    return Engine(EngineArgs(model_path=checkpoint.path, dtype="float32", device="cpu", block_size=4,
                             num_kv_blocks=64, lora=lora, **extra))  # type: ignore[arg-type]  # fmt: skip


def _generate(engine: Engine) -> tuple[dict[str, list[int]], LogitRecorder]:
    recorder = LogitRecorder()
    recorder.attach(engine)
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, greedy(max_tokens=8))
    results = run_to_completion(engine)[0]
    return {rid: result.output_ids for rid, result in results.items()}, recorder


def _max_logit_gap(left: LogitRecorder, right: LogitRecorder) -> float:
    gaps = [0.0]
    for request_id, rows in left.rows.items():
        other = dict(right.rows[request_id])
        gaps += [(logits - other[length]).abs().max().item() for length, logits in rows]
    return max(gaps)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    # biases on q|k|v and o, q/k columns interleaved, and a model the step-kernel rounds cover
    return make_checkpoint("llama_linear_rope_bias", tmp_path_factory.mktemp("lora_unmerged"))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_unmerged_serves_what_merge_serves(checkpoint: Checkpoint, path: str) -> None:
    versions = [_version(checkpoint, seed) for seed in (1, 2)]
    engines = {mode: _engine(checkpoint, mode, **PATHS[path]) for mode in ("merge", "unmerged")}
    base_tokens, _ = _generate(_engine(checkpoint, "unmerged", **PATHS[path]))
    for number, version in enumerate(versions, start=1):
        for engine in engines.values():
            engine.load_weights(list(version.items()), version=number)
        (merged, merged_logits), (unmerged, unmerged_logits) = (_generate(e) for e in engines.values())
        assert unmerged == merged
        assert _max_logit_gap(unmerged_logits, merged_logits) < TOLERANCE
        assert unmerged != base_tokens, "the adapters change what the model generates"


def test_a_partial_load_uses_the_held_half(checkpoint: Checkpoint) -> None:
    first, second = _version(checkpoint, 1), _version(checkpoint, 2)
    engine = _engine(checkpoint, "unmerged")
    engine.load_weights(list(first.items()), version=1)
    only_b = [(n, t) for n, t in second.items() if n.endswith("lora_B")]
    engine.load_weights(only_b, version=2)
    whole = _engine(checkpoint, "merge")
    whole.load_weights(list({**first, **dict(only_b)}.items()), version=2)
    (tokens, logits), (expected, expected_logits) = _generate(engine), _generate(whole)
    assert tokens == expected
    assert _max_logit_gap(logits, expected_logits) < TOLERANCE


def test_the_base_weights_stay_and_adapters_only_are_held(checkpoint: Checkpoint) -> None:
    engine = _engine(checkpoint, "unmerged")
    before = {n: t.clone() for n, t in engine.runner.model.state_dict().items()}
    engine.load_weights(list(_version(checkpoint, 1).items()), version=1)
    after = engine.runner.model.state_dict()
    assert all(torch.equal(t, after[n]) for n, t in before.items())
    layer = engine.runner.model.layers[0]
    assert layer.qkv_proj.lora_a_t.shape == (64, 3 * RANK)  # q, k and v's adapters side by side
    assert layer.o_proj.lora_b_t.shape == (RANK, 64)


def test_bad_adapters_change_nothing(checkpoint: Checkpoint) -> None:
    engine = _engine(checkpoint, "unmerged", targets=("q_proj", "v_proj"))
    engine.load_weights(list(_version(checkpoint, 1, ("q_proj", "v_proj")).items()), version=1)
    tokens, _ = _generate(engine)
    version = _version(checkpoint, 2)
    with pytest.raises(AdapterError, match="no targeted projection"):
        engine.load_weights(list(version.items()), version=2)  # carries o_proj, mlp... adapters too
    with pytest.raises(AdapterError, match="never loaded"):
        _engine(checkpoint, "unmerged").load_weights([next(iter(version.items()))], version=1)
    wrong_rank = {n: t[:2] if n.endswith("lora_A") else t[:, :2] for n, t in version.items() if "q_proj" in n}
    with pytest.raises(AdapterError, match=r"actor\.lora\.rank"):
        engine.load_weights(list(wrong_rank.items()), version=2)
    assert engine.weight_version == 1
    assert _generate(engine)[0] == tokens


def test_the_mode_comes_from_the_config_and_needs_a_rank(checkpoint: Checkpoint) -> None:
    config = load_config(overrides=["actor.lora.rank=4", "engine.lora_mode=unmerged"])
    assert EngineArgs.from_config(config).lora == LoraServing(32.0, TARGETS, rank=4, mode="unmerged")
    assert EngineArgs.from_config(load_config(overrides=["actor.lora.rank=4"])).lora.mode == "merge"  # type: ignore[union-attr]
    with pytest.raises(AdapterError, match=r"actor\.lora\.rank=0"):
        Engine(EngineArgs(model_path=checkpoint.path, device="cpu", lora=LoraServing(ALPHA, TARGETS, mode="unmerged")))
