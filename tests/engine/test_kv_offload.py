"""The offload tier on the embedded engine, with LMCache's CPU backend holding the bytes.

Evicted prefix blocks go to the tier and come back instead of being recomputed, with identical
greedy tokens and log-probabilities; entries never cross weight versions.
"""

from __future__ import annotations

import pytest
import torch

from psrl.engine import Engine, RequestResult
from tests.engine.conftest import Checkpoint, greedy, make_engine, run_to_completion

pytest.importorskip("lmcache", reason="needs the kv extra: pip install -c constraints.txt -e '.[kv]'")
pytestmark = pytest.mark.kv

BLOCK = 4
PROMPT = [(7 * i + 3) % 90 + 1 for i in range(29)]  # 7 whole blocks before the last token
FILLERS = [[(11 * i + k) % 90 + 1 for i in range(30)] for k in range(1, 4)]


def tiered(checkpoint: Checkpoint, **overrides: object) -> Engine:
    values: dict[str, object] = dict(num_kv_blocks=20, offload_bytes=4 << 20, max_num_seqs=2)
    values.update(overrides)
    return make_engine(checkpoint, **values)


def hf_weights(checkpoint: Checkpoint, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {name: tensor.detach() * scale for name, tensor in checkpoint.model.state_dict().items()}


def run_one(engine: Engine, rid: str, prompt: list[int], num_tokens: int = 6, **prior: object) -> RequestResult:
    engine.add_request(rid, prompt, greedy(num_tokens), **prior)  # type: ignore[arg-type]
    results, _ = run_to_completion(engine)
    return results[rid]


def evict_everything(engine: Engine) -> None:
    for k, filler in enumerate(FILLERS):
        run_one(engine, f"filler-{engine.weight_version}-{k}", filler)


def test_reload_from_tier_gives_the_tokens_of_a_recompute(qwen2: Checkpoint) -> None:
    engine = tiered(qwen2)
    first = run_one(engine, "a", PROMPT)
    evict_everything(engine)
    assert engine.block_manager.cached_blocks(PROMPT) == []  # gone from the device
    assert engine.status().num_tier_offloaded_blocks >= 7
    again = run_one(engine, "b", PROMPT)
    assert engine.status().num_tier_loaded_tokens == 7 * BLOCK
    plain = make_engine(qwen2, num_kv_blocks=20, enable_prefix_caching=False)
    recomputed = run_one(plain, "c", PROMPT)
    assert again.output_ids == recomputed.output_ids == first.output_ids
    assert torch.allclose(torch.tensor(again.logprobs), torch.tensor(recomputed.logprobs), atol=1e-4)


def test_an_entry_is_never_returned_under_another_version(qwen2: Checkpoint) -> None:
    engine = tiered(qwen2)
    run_one(engine, "a", PROMPT)
    evict_everything(engine)
    tier = engine.kv_tier
    assert tier is not None
    old_keys = {key for key in tier.keys() if key[0] == 0}  # noqa: SIM118 (a tier, not a dict)
    assert old_keys
    # the very same weights, but version 1: version-0 entries are structurally out of reach
    engine.load_weights(hf_weights(qwen2), version=1)
    run_one(engine, "b", PROMPT)
    assert engine.status().num_tier_loaded_tokens == 0
    assert old_keys <= set(tier.keys())  # not cleared: they age out through LRU
    evict_everything(engine)
    run_one(engine, "c", PROMPT)
    assert engine.status().num_tier_loaded_tokens == 7 * BLOCK  # version-1 entries hit under version 1


def test_clear_on_weight_update_empties_the_tier(qwen2: Checkpoint) -> None:
    engine = tiered(qwen2, offload_clear_on_update=True)
    run_one(engine, "a", PROMPT)
    evict_everything(engine)
    tier = engine.kv_tier
    assert tier is not None and len(tier) > 0
    engine.load_weights(hf_weights(qwen2), version=1)
    assert len(tier) == 0 and tier.used_bytes == 0


def test_a_partial_rollout_straddling_an_update_recomputes_under_the_new_weights(qwen2: Checkpoint) -> None:
    engine = tiered(qwen2)
    engine.add_request("r", PROMPT, greedy(12))
    for _ in range(4):
        engine.step()
    interrupted = engine.abort("r")
    assert interrupted is not None and interrupted.output_ids
    engine.export_prefix_kv(PROMPT + interrupted.output_ids)  # as a re-route would
    new_weights = hf_weights(qwen2, 1.05)
    engine.load_weights(new_weights, version=1)
    prior = dict(prior_output_ids=interrupted.output_ids, prior_logprobs=interrupted.logprobs,
                 prior_versions=interrupted.versions)  # fmt: skip
    continued = run_one(engine, "r2", PROMPT, 12, **prior)
    assert engine.status().num_tier_loaded_tokens == 0  # no version-0 block for version-1 tokens
    fresh = make_engine(qwen2, num_kv_blocks=20, enable_prefix_caching=False)
    fresh.load_weights(new_weights, version=1)
    reference = run_one(fresh, "r3", PROMPT, 12, **prior)
    assert continued.output_ids == reference.output_ids
    assert continued.versions[len(interrupted.output_ids) :] == [1] * (12 - len(interrupted.output_ids))
    assert torch.allclose(torch.tensor(continued.logprobs), torch.tensor(reference.logprobs), atol=1e-4)


def test_pinned_entries_survive_pressure_until_released(qwen2: Checkpoint) -> None:
    engine = tiered(qwen2, offload_bytes=24 * 2 * 2 * BLOCK * 2 * 8 * 4)  # room for 24 blocks of this model
    run_one(engine, "a", PROMPT)
    tier = engine.kv_tier
    assert tier is not None
    keys = engine.export_prefix_kv(PROMPT)
    assert len(keys) == 7
    tier.pin("transfer-1", keys)
    for k in range(4):  # far more than the tier holds
        run_one(engine, f"x{k}", [(13 * i + k) % 90 + 1 for i in range(40)])
        evict_everything(engine)
    assert set(keys) <= set(tier.keys())
    assert tier.index.num_evicted > 0
    tier.unpin("transfer-1")
    for k in range(4):
        run_one(engine, f"y{k}", [(17 * i + k) % 90 + 1 for i in range(40)])
    assert not set(keys) <= set(tier.keys())
