"""The offload tier with its bytes in psrl's own host buffer (psrl.lmcache.store=host, no LMCache).

Evicted prefix blocks go to the tier and come back instead of being recomputed, with the tokens of a
recompute; entries never cross weight versions; a full buffer makes the tier evict, never fail.
"""

from __future__ import annotations

import pytest
import torch

from psrl.config import load_config
from psrl.engine import Engine, RequestResult
from psrl.errors import ConfigError
from psrl.kvcache.host_store import HostStore
from tests.engine.conftest import Checkpoint, greedy, make_engine, run_to_completion

BLOCK = 4
PROMPT = [(7 * i + 3) % 90 + 1 for i in range(29)]  # 7 whole blocks before the last token
FILLERS = [[(11 * i + k) % 90 + 1 for i in range(30)] for k in range(1, 4)]


def tiered(checkpoint: Checkpoint, offload_bytes: int = 4 << 20) -> Engine:
    return make_engine(checkpoint, num_kv_blocks=20, offload_bytes=offload_bytes, max_num_seqs=2, offload_store="host")


def run_one(engine: Engine, rid: str, prompt: list[int], num_tokens: int = 6) -> RequestResult:
    engine.add_request(rid, prompt, greedy(num_tokens))
    results, _ = run_to_completion(engine)
    return results[rid]


def evict_everything(engine: Engine) -> None:
    for k, filler in enumerate(FILLERS):
        run_one(engine, f"filler-{engine.weight_version}-{k}", filler)


def test_reload_from_the_host_tier_gives_the_tokens_of_a_recompute(qwen2: Checkpoint) -> None:
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


def test_a_host_tier_entry_is_never_returned_under_another_version(qwen2: Checkpoint) -> None:
    engine = tiered(qwen2)
    run_one(engine, "a", PROMPT)
    evict_everything(engine)
    weights = {name: tensor.detach() for name, tensor in qwen2.model.state_dict().items()}
    engine.load_weights(weights, version=1)
    run_one(engine, "b", PROMPT)
    assert engine.status().num_tier_loaded_tokens == 0


def test_a_full_host_buffer_makes_the_tier_evict(qwen2: Checkpoint) -> None:
    engine = tiered(qwen2)
    block_bytes = engine.offload.tier.store.slots[0].numel() * 4  # type: ignore[union-attr]
    small = tiered(qwen2, offload_bytes=3 * block_bytes)
    run_one(small, "a", PROMPT)
    evict_everything(small)  # far more evicted blocks than 3 slots
    tier = small.offload.tier  # type: ignore[union-attr]
    assert len(tier) <= 3 and tier.stats.num_stored > 3
    store = HostStore(2 * block_bytes, tuple(tier.store.slots.shape[1:]), torch.float32)
    with pytest.raises(MemoryError):
        store.put_many([(0, 1), (0, 2), (0, 3)], torch.zeros(3, *store.block_shape))
    with pytest.raises(ValueError, match="offload_size_gb"):
        HostStore(block_bytes - 1, store.block_shape, torch.float32)


def test_the_host_store_cannot_serve_p2p_kv_transfers() -> None:
    with pytest.raises(ConfigError, match="store"):
        load_config("demo", ["psrl.lmcache.enable=true", "psrl.lmcache.enable_p2p=true", "psrl.lmcache.store=host"])
