"""KV transfer between two real instance processes (ZeroMQ frames and NIXL over UCX).

The source runs a request part-way, is interrupted (as a migration would), keeps the request's
blocks in its tier and serves them; the target fetches them, continues the request from them and
must produce exactly the tokens and log-probabilities of a target that re-prefilled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import zmq

from psrl.engine import Engine
from psrl.engine.scheduler import ARRIVING_CHUNK_BLOCKS
from psrl.kvcache.transfer import KvFetcher
from tests.engine.conftest import Checkpoint, greedy, make_engine, run_to_completion

pytest.importorskip("lmcache", reason="needs the kv extra: pip install -c constraints.txt -e '.[kv]'")
pytestmark = pytest.mark.kv

PROMPT = [(5 * i + 2) % 90 + 1 for i in range(37)]
NUM_TOKENS = 14
PIN = "transfer-r"

SOURCE = textwrap.dedent(
    """
    import json, sys
    from psrl.engine import Engine, EngineArgs, SamplingParams
    from psrl.kvcache.transfer import KvServer
    path, prompt, pin = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    engine = Engine(EngineArgs(model_path=path, dtype="float32", device="cpu", block_size=4, num_kv_blocks=40,
                               offload_bytes=8 << 20))
    engine.add_request("r", prompt, SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True))
    for _ in range(6):
        engine.step()
    result = engine.abort("r")
    keys = engine.export_prefix_kv(prompt + result.output_ids)
    if pin:
        engine.kv_tier.pin(pin, keys)
    server = KvServer(engine.kv_tier)
    print("KV", json.dumps({"address": server.address, "outputs": result.output_ids, "logprobs": result.logprobs,
                      "versions": result.versions, "keys": len(keys)}), flush=True)
    sys.stdin.read()  # serve until the test closes stdin
    print("KV", json.dumps({"served": server.num_served_blocks, "pinned": engine.kv_tier.index.pin_owners}), flush=True)
    """
).replace("NUM_TOKENS", str(NUM_TOKENS))


def start_source(checkpoint: Checkpoint, pin: str) -> tuple[subprocess.Popen[str], dict]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", SOURCE, str(checkpoint.path), json.dumps(PROMPT), pin],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    return proc, read_report(proc)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


@pytest.fixture(scope="module")
def source(qwen2: Checkpoint) -> Iterator[tuple[subprocess.Popen[str], dict]]:
    """One source for the module: its request's blocks are pinned for ``PIN`` until a fetch releases it."""
    proc, started = start_source(qwen2, PIN)
    yield proc, started
    stop(proc)


def read_report(proc: subprocess.Popen[str]) -> dict:
    """The next line the source marked as its report (the engine logs to stdout too)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("KV "):
            return json.loads(line[3:])
    raise AssertionError("the source process ended without a report")


def continue_on(engine: Engine, started: dict) -> tuple[list[int], list[float]]:
    engine.add_request("r", PROMPT, greedy(NUM_TOKENS), prior_output_ids=started["outputs"],
                       prior_logprobs=started["logprobs"], prior_versions=started["versions"])  # fmt: skip
    results, _ = run_to_completion(engine)
    return results["r"].output_ids, results["r"].logprobs


def reprefilled(checkpoint: Checkpoint, started: dict) -> tuple[list[int], list[float]]:
    return continue_on(make_engine(checkpoint, num_kv_blocks=40, enable_prefix_caching=False), started)


@pytest.mark.parametrize("channel", ["tcp", "nixl"])
@pytest.mark.parametrize("piece_blocks", [16, 3])
def test_continuing_from_transferred_kv_matches_a_reprefill(
    qwen2: Checkpoint, source: tuple[subprocess.Popen[str], dict], channel: str, piece_blocks: int
) -> None:
    """In one piece or several (each landing in the tier on its own, NIXL writing it in place)."""
    if channel == "nixl":
        pytest.importorskip("nixl")
    _proc, started = source
    target = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20)
    assert target.kv_tier is not None
    fetcher = KvFetcher(target.kv_tier, channel, piece_blocks=piece_blocks)  # type: ignore[arg-type]
    keys = target.prefix_keys(PROMPT + started["outputs"])
    assert fetcher.fetch("warm", started["address"], [], timeout_s=30).error == ""  # connects, moves nothing
    outcome = fetcher.fetch("t1", started["address"], keys, timeout_s=30)
    fetcher.close()
    assert fetcher.join(30.0)
    assert outcome.error == ""
    assert outcome.num_blocks == min(len(keys), started["keys"]) > 0
    tokens, logprobs = continue_on(target, started)
    assert target.status().num_tier_loaded_tokens == outcome.num_blocks * 4
    want_tokens, want_logprobs = reprefilled(qwen2, started)
    assert tokens == want_tokens
    assert torch.allclose(torch.tensor(logprobs), torch.tensor(want_logprobs), atol=1e-4)


def test_no_entry_crosses_versions_in_a_transfer(qwen2: Checkpoint, source: tuple[subprocess.Popen[str], dict]) -> None:
    _, started = source
    target = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20, initial_weight_version=3)
    assert target.kv_tier is not None
    fetcher = KvFetcher(target.kv_tier)
    outcome = fetcher.fetch("t2", started["address"], target.prefix_keys(PROMPT + started["outputs"]), 30)
    fetcher.close()
    assert outcome.error == "" and outcome.num_blocks == 0  # the source holds version 0 only
    assert len(target.kv_tier) == 0


def test_async_prefill_takes_the_blocks_that_land_while_it_runs(
    qwen2: Checkpoint, source: tuple[subprocess.Popen[str], dict]
) -> None:
    """The target starts prefilling before the transfer lands (async): the chunks after it landed are
    loaded, not computed, and the tokens are those of a full re-prefill."""
    _, started = source
    target = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20, max_num_batched_tokens=64)
    assert target.kv_tier is not None
    target.add_request("r", PROMPT, greedy(NUM_TOKENS), prior_output_ids=started["outputs"],
                       prior_logprobs=started["logprobs"], prior_versions=started["versions"])  # fmt: skip
    target.expect_kv("r")
    target.step()  # the first short chunk, computed: nothing has landed
    fetcher = KvFetcher(target.kv_tier, piece_blocks=3)
    outcome = fetcher.fetch("t5", started["address"], target.prefix_keys(PROMPT + started["outputs"]), 30)
    fetcher.close()
    assert outcome.error == "" and outcome.num_blocks > 0
    target.kv_arrived("r")  # takes the landed blocks past the first chunk
    results, _ = run_to_completion(target)
    status = target.status()
    loaded_blocks = outcome.num_blocks - ARRIVING_CHUNK_BLOCKS  # all but those of the first chunk
    assert status.num_tier_loaded_tokens == status.num_prefix_hit_tokens == loaded_blocks * 4 > 0
    want_tokens, want_logprobs = reprefilled(qwen2, started)
    assert results["r"].output_ids == want_tokens
    assert torch.allclose(torch.tensor(results["r"].logprobs), torch.tensor(want_logprobs), atol=1e-4)


def test_close_ends_a_fetch_in_flight(qwen2: Checkpoint) -> None:
    """A fetch from a source that never answers ends when the fetcher closes, not at its timeout
    (an instance stopping with a fetch in flight would otherwise hold its exit that long)."""
    target = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20)
    assert target.kv_tier is not None
    fetcher = KvFetcher(target.kv_tier)
    silent = fetcher._context.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        future = fetcher.start("t6", f"tcp://127.0.0.1:{port}", target.prefix_keys(PROMPT), timeout_s=3600)
        fetcher.close()
        assert fetcher.join(60.0)
        assert "closing" in future.result().error
    finally:
        silent.close(0)


def test_pin_sync_pins_are_released_once_served(qwen2: Checkpoint, source: tuple[subprocess.Popen[str], dict]) -> None:
    """Piece by piece: each piece unpins what it served, the last one leaves nothing pinned."""
    proc, started = source
    target = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20)
    assert target.kv_tier is not None
    fetcher = KvFetcher(target.kv_tier, piece_blocks=3)
    outcome = fetcher.fetch("t3", started["address"], target.prefix_keys(PROMPT + started["outputs"]), 30,
                            release_pin=PIN)  # fmt: skip
    fetcher.close()
    assert outcome.num_blocks > 0
    assert proc.stdin is not None
    proc.stdin.close()
    final = read_report(proc)
    assert final["pinned"] == [] and final["served"] >= outcome.num_blocks


def test_a_dead_source_falls_back_to_reprefill_and_loses_nothing(qwen2: Checkpoint) -> None:
    proc, started = start_source(qwen2, "")
    os.kill(proc.pid, signal.SIGKILL)
    stop(proc)
    target = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20)
    assert target.kv_tier is not None
    fetcher = KvFetcher(target.kv_tier)
    outcome = fetcher.fetch("t4", started["address"], target.prefix_keys(PROMPT + started["outputs"]), 1.0)
    fetcher.close()
    assert outcome.num_blocks == 0 and "TimeoutError" in outcome.error
    tokens, logprobs = continue_on(target, started)
    want_tokens, want_logprobs = reprefilled(qwen2, started)
    assert tokens == want_tokens and len(tokens) == NUM_TOKENS
    assert torch.allclose(torch.tensor(logprobs), torch.tensor(want_logprobs), atol=1e-4)


def test_a_failed_nixl_write_is_answered_and_the_server_keeps_serving(qwen2: Checkpoint) -> None:
    """NIXL's errors are not RuntimeErrors: one from a bad peer used to end the server's thread, and
    with it every later fetch from that instance."""
    pytest.importorskip("nixl")
    from psrl.kvcache.transfer import KvServer
    from psrl.kvcache.transfer.wire import ENCODER, REPLY_DECODER, FetchRequest

    source = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20)
    assert source.kv_tier is not None
    source.add_request("r", PROMPT, greedy(2))
    run_to_completion(source)
    keys = source.export_prefix_kv(PROMPT)
    server = KvServer(source.kv_tier)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.connect(server.address)
        sock.send(ENCODER.encode(FetchRequest("bad", keys, "nixl", "", "nobody", b"not metadata", [(4096, 1 << 20)])))
        assert sock.poll(60_000)
        reply = REPLY_DECODER.decode(sock.recv_multipart()[0])
        assert reply.error.startswith("nixl write failed") and reply.keys == []
        target = make_engine(qwen2, num_kv_blocks=40, offload_bytes=8 << 20)
        assert target.kv_tier is not None
        fetcher = KvFetcher(target.kv_tier)
        outcome = fetcher.fetch("good", server.address, keys, 60)
        fetcher.close()
        assert outcome.error == "" and outcome.num_blocks == len(keys) > 0
    finally:
        sock.close(0)
        server.close()
