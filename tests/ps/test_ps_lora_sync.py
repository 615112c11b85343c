"""LoRA versions through real parameter-server shards: the trainer pushes adapters only, a rollout engine
pulls adapters only (whole, then by delta sync, every entry checked against its checksum) and serves
exactly the trainer's merged model; a version costs a small fraction of the full weights' bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from ps_helpers import ThreadShards

from psrl.engine import Engine, EngineArgs
from psrl.ps import Puller, Pusher
from psrl.trainer import TrainerCore
from psrl.trainer.lora import merged_state_dict
from tests.trainer.trainer_helpers import make_buffer, trainer_config

MakeShards = Callable[..., ThreadShards]
# the demo model with adapters on q_proj and v_proj at rank 8: the attention update of the LoRA papers
LORA = ["actor.lora.rank=8", "actor.lora.alpha=16", "actor.lora.target_modules=[q_proj,v_proj]"]
MIN_RATIO = 20


def _engine_weights(engine: Engine) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in engine.runner.model.state_dict().items()}


def _full_weights(core: TrainerCore) -> dict[str, torch.Tensor]:
    """What a version would be without LoRA: the merged model's persistent tensors, tied weights once."""
    raw = core.policy.raw
    merged = merged_state_dict(raw, raw.state_dict())
    tied = {"lm_head.weight"} if raw.config.tie_word_embeddings else set()
    return {n: t.contiguous() for n, t in merged.items() if n not in tied}


def test_adapter_versions_sync_through_shards_at_a_fraction_of_the_bytes(make_shards: MakeShards) -> None:
    config = trainer_config(LORA)
    core = TrainerCore(config)
    args = dataclasses.replace(EngineArgs.from_config(config), dtype="float32", device="cpu", num_kv_blocks=64)
    assert args.lora is not None
    engine = Engine(args)
    shards = make_shards(2)
    pusher = Pusher(shards.push_endpoints, incarnation=1, timeout_s=30)
    puller = Puller(shards.pull_endpoints, timeout_s=10, delta_sync=True)
    try:
        pulls = []
        for buffer_id in (0, 1, 2):
            core.train_buffer(buffer_id, make_buffer(buffer_id))
            adapters = dict(core.named_weights())
            pushed = pusher.push(core.version, adapters)
            assert pushed.num_bytes == sum(t.numel() * t.element_size() for t in adapters.values())
            stream = puller.stream(core.version)
            engine.load_weights(stream, core.version)
            pulls.append(stream.result)
            merged = merged_state_dict(core.policy.raw, core.policy.raw.state_dict())
            reference = Engine(dataclasses.replace(args, lora=None), weights=merged)
            expected = _engine_weights(reference)
            assert all(torch.equal(t, expected[n]) for n, t in _engine_weights(engine).items()), core.version
        assert {r.num_entries for r in pulls} and all(r.num_bytes <= r.num_bytes_total for r in pulls)
        full = _full_weights(core)
        full_bytes = _push_once(make_shards(2), full)
    finally:
        pusher.close()
        puller.close()
    ratio = full_bytes / pushed.num_bytes
    print(f"RESULT lora_bytes_per_version={pushed.num_bytes} full_bytes_per_version={full_bytes} ratio={ratio:.1f}")
    assert ratio >= MIN_RATIO


def _push_once(shards: ThreadShards, tensors: dict[str, torch.Tensor]) -> int:
    pusher = Pusher(shards.push_endpoints, incarnation=1, timeout_s=30)
    try:
        return pusher.push(1, tensors).num_bytes
    finally:
        pusher.close()


def test_delta_sync_sends_sparse_adapter_entries_and_the_merge_stays_exact(make_shards: MakeShards) -> None:
    """Served in bf16 at a small rate, lora_A moves by less than a bf16 step almost everywhere: its entries
    come as sparse deltas (lora_B, starting at zero, changes everywhere and comes whole); the engine fed
    by delta sync holds exactly what an engine fed whole versions holds."""
    config = trainer_config([*LORA, "actor.lora.lr=1e-5"])
    core = TrainerCore(config)
    args = dataclasses.replace(EngineArgs.from_config(config), dtype="float32", device="cpu", num_kv_blocks=64)
    by_delta, whole = Engine(args), Engine(args)
    shards = make_shards(2, serve_dtype="bfloat16")
    pusher = Pusher(shards.push_endpoints, incarnation=1, timeout_s=30)
    delta_puller = Puller(shards.pull_endpoints, timeout_s=10, delta_sync=True)
    whole_puller = Puller(shards.pull_endpoints, timeout_s=10)
    try:
        saved = []
        for buffer_id in (0, 1, 2):
            core.train_buffer(buffer_id, make_buffer(buffer_id))
            pusher.push(core.version, dict(core.named_weights()))
            stream = delta_puller.stream(core.version)
            by_delta.load_weights(stream, core.version)
            saved.append(stream.result.num_bytes_saved)
            whole.load_weights(whole_puller.stream(core.version), core.version)
            expected = _engine_weights(whole)
            assert all(torch.equal(t, expected[n]) for n, t in _engine_weights(by_delta).items()), core.version
    finally:
        for part in (pusher, delta_puller, whole_puller):
            part.close()
    print(f"delta sync: bytes saved per pull {saved}")
    assert saved[0] == 0 and all(s > 0 for s in saved[1:]), saved  # sparse lora_A entries from the second pull
