"""A session's turns on one engine: what the prefix cache reuses, what a weight load invalidates, and the
KV use the session scheduler's capacity view reads.

Reuse: a continuing turn's prompt is its previous context (prompt, generated tokens) plus the tool's
output; every whole block of the previous context whose keys/values were computed is reused, only the
rest (the last partial block, the last sampled token, the new tokens) is prefilled.

Invalidation rule: a block's keys/values are valid only under the weights that computed them. A weight
load of a new version makes every block cached before it unreachable (the engine runs one version: a
session's next turn computes under the new weights, and attending over keys/values of other weights
would give log-probs of neither policy, so blocks are not kept per version for sessions pinned to the
old one); blocks computed after the load are reused as before. The offload tier keeps its entries
(tagged with their version, they never hit under another one). Instances load only newer versions.
"""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.torch import load_file

from bus.messages import InstanceStatus
from psrl.config import load_config
from psrl.engine import Engine, SamplingParams
from psrl.flows.driver import MemoryWeights
from psrl.flows.effects import Send
from psrl.flows.instance import InstanceFlow
from psrl.flows.session import SessionFlow
from tests.engine.conftest import Checkpoint, make_engine

BLOCK = 4
PATHS = [pytest.param({}, id="step"), pytest.param({"gpu_kernels": "torch", "decode_steps": 4}, id="rounds")]


def _turn(engine: Engine, request_id: str, prompt: list[int], max_tokens: int) -> tuple[list[int], int]:
    """Run one turn to its end; its generated tokens and the prefix-cache hit tokens of its admission."""
    before = engine.status().num_prefix_hit_tokens
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=1))
    outputs: list[int] = []
    while engine.has_unfinished_requests():
        outputs += [t for out in engine.step().outputs for t in out.token_ids]
    return outputs, engine.status().num_prefix_hit_tokens - before


@pytest.mark.parametrize("path", PATHS)
def test_a_next_turn_reuses_every_computed_whole_block_of_its_previous_context(
    qwen2: Checkpoint, path: dict[str, object]
) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64, **path)
    prompt = [3 + i % 20 for i in range(21)]
    generated, hits = _turn(engine, "t0", prompt, max_tokens=10)
    assert hits == 0 and len(generated) == 10
    context = prompt + generated  # 31 tokens, the last one sampled but never fed: 30 computed
    tool = [5, 6, 7, 8, 9, 10, 11]
    _, hits = _turn(engine, "t1", context + tool, max_tokens=3)
    # every whole block computed before is reused; only the partial block's 2 computed tokens come again
    assert hits == (len(context) - 1) // BLOCK * BLOCK == 28


def test_a_weight_load_invalidates_older_blocks_and_nothing_computed_after_it(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64)
    prompt = [3 + i % 20 for i in range(24)]
    _turn(engine, "v0", prompt, max_tokens=2)
    assert _turn(engine, "v0-again", prompt, max_tokens=2)[1] == 20  # cached under version 0
    weights = [item for path in sorted(qwen2.path.glob("*.safetensors")) for item in load_file(path).items()]
    engine.load_weights(weights, version=1)  # same values: only the version says they may differ
    assert _turn(engine, "v1", prompt, max_tokens=2)[1] == 0  # version 0's blocks are never hit again
    assert _turn(engine, "v1-again", prompt, max_tokens=2)[1] == 20  # version 1's are


def test_the_capacity_view_of_the_session_scheduler_is_the_engines_blocks_in_use(qwen2: Checkpoint) -> None:
    config = load_config("agentic", [f"engine.block_size={BLOCK}", "engine.num_kv_blocks=64"])
    engine = make_engine(qwen2, num_kv_blocks=64)
    instance = InstanceFlow("rollout-0", config, engine, MemoryWeights())
    sessions = SessionFlow(config, env=_NoEnv())

    def report() -> float:
        [status] = [e.message for e in instance.status(0.0) if isinstance(e, Send)]
        assert isinstance(status, InstanceStatus)
        sessions.handle(status, 0.0)
        return sessions.capacity["rollout-0"].used_tokens

    prompt = [3 + i % 20 for i in range(40)]
    engine.add_request("0", prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()  # prefilled, running: its blocks are in use
    assert report() == engine.block_manager.num_used_blocks * BLOCK == 40
    while engine.has_unfinished_requests():
        engine.step()
    assert report() == 0.0  # finished: its blocks stay cached for the next turn but hold no room
    assert _turn(engine, "1", prompt, max_tokens=1)[1] == 36
    assert sessions.capacity["rollout-0"].total_tokens == 64 * BLOCK


class _NoEnv:
    def submit(self, request_id: int, prompt_id: int, turn: int, actions: list[np.ndarray]) -> None:
        raise AssertionError("no environment step in this test")

    def cancel(self, request_id: int) -> None:
        pass
