"""KV offload tier and KV transfer on the embedded engine (CPU), each against its baseline in the same run.

1. Prefix-heavy multi-turn: sessions whose every turn appends to the session's long history; more
   sessions than the device KV holds. Tier off vs on: prefill tokens computed, tokens loaded from
   the tier, wall time.
2. Re-route: a request with a long context (--reroute-tokens) is interrupted on a source engine and
   continued on a target engine: by re-prefill, or from KV fetched from the source's KV server
   (ZeroMQ frames, NIXL writes) in each mode. Time to first token after the re-route, and the
   transfer's GB/s against a raw ZeroMQ send / NIXL write of the same bytes (the toy model's KV:
   4 KiB a token).
3. Transfer at real models' KV sizes (tools/bench_kv_transfer.py): Qwen2.5-0.5B and -7B blocks, 1k
   and 4k contexts, sync fetches on both channels against raw moves of the same bytes.

    make install-kv && .venv-kv/bin/python tools/bench_kv.py

Ends with ``RESULT prefill_saved=... reroute_ttft_vs_reprefill=... transfer_vs_raw=...``;
``transfer_vs_raw`` is from 3. (the median over the four sizes of the better channel's fetch/raw;
``nixl_vs_raw``, ``tcp_vs_raw``, ``nixl_gbps``, ``tcp_gbps``: each channel's medians),
``transfer_vs_raw_toy`` the same ratio from 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.kvcache.transfer import FetchOutcome, KvFetcher, KvServer
from psrl.kvcache.transfer.client import PIECE_BLOCKS
from tools.bench_kv_transfer import raw_rates, transfer_fields, transfer_table

VOCAB = 512


def write_model(directory: Path, max_len: int) -> None:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len,
                         initializer_range=0.2, eos_token_id=None)  # fmt: skip
    Qwen2ForCausalLM(config).eval().save_pretrained(directory)


def engine(model: Path, num_blocks: int, tier_bytes: int) -> Engine:
    return Engine(EngineArgs(model_path=model, dtype="float32", device="cpu", block_size=16,
                             num_kv_blocks=num_blocks, max_num_seqs=4, offload_bytes=tier_bytes))  # fmt: skip


def greedy(num_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)


def run(
    eng: Engine,
    rid: str,
    prompt: list[int],
    num_tokens: int,
    arriving: Future[FetchOutcome] | None = None,
    **prior: object,
) -> tuple[list[int], float]:
    """(output ids, seconds to the first new token). ``arriving``: an async fetch of the request's KV
    still in flight, taken block by block as the prefill goes (as the rollout instance does)."""
    started = time.perf_counter()
    eng.add_request(rid, prompt, greedy(num_tokens), **prior)  # type: ignore[arg-type]
    if arriving is not None:
        eng.expect_kv(rid)
    first, result = None, None
    while eng.has_unfinished_requests():
        if arriving is not None and arriving.done():
            eng.kv_arrived(rid)
            arriving = None
        out = eng.step()
        if first is None and out.outputs:
            first = time.perf_counter() - started
        for finished in out.finished:
            result = finished
    assert result is not None and first is not None
    return result.output_ids, first


# ------------------------------------------------------------------ 1. prefix-heavy multi-turn


def multi_turn(model: Path, args: argparse.Namespace, tier_bytes: int) -> dict[str, float]:
    eng = engine(model, args.device_blocks, tier_bytes)
    histories = [[(97 * s + 13 * i) % (VOCAB - 1) + 1 for i in range(args.shared_prefix)] for s in range(args.sessions)]
    started = time.perf_counter()
    generated = 0
    for turn in range(args.turns):
        for s, history in enumerate(histories):
            outputs, _ = run(eng, f"s{s}t{turn}", history, args.turn_tokens)
            generated += len(outputs)
            history.extend(outputs + [(s * 31 + turn * 7 + i) % (VOCAB - 1) + 1 for i in range(args.user_tokens)])
    seconds = time.perf_counter() - started
    status = eng.status()
    computed = status.num_prefix_queried_tokens - status.num_prefix_hit_tokens
    return {"prefill_computed": computed, "tier_loaded": status.num_tier_loaded_tokens, "seconds": seconds,
            "tokens_per_s": generated / seconds}  # fmt: skip


# ------------------------------------------------------------------ 2. re-route


def reroute(model: Path, args: argparse.Namespace) -> dict[str, float]:
    prompt = [(31 * i + 7) % (VOCAB - 1) + 1 for i in range(args.reroute_tokens)]
    blocks = args.reroute_tokens // 16 + 16
    source = engine(model, blocks, 256 << 20)
    source.add_request("r", prompt, greedy(8))
    while not any(out.outputs for out in [source.step()]):
        pass
    interrupted = source.abort("r")
    assert interrupted is not None
    prior = dict(prior_output_ids=interrupted.output_ids, prior_logprobs=interrupted.logprobs,
                 prior_versions=interrupted.versions)  # fmt: skip
    tokens = prompt + interrupted.output_ids
    source.export_prefix_kv(tokens)
    assert source.kv_tier is not None
    server = KvServer(source.kv_tier)
    results: dict[str, float] = {}
    reference, ttfts = None, []
    for _ in range(args.repeats):
        target = engine(model, blocks, 256 << 20)
        outputs, ttft = run(target, "r", prompt, 16, **prior)
        reference = reference or outputs
        ttfts.append(ttft)
    results["ttft_reprefill_s"] = statistics.median(ttfts)
    for channel in ("tcp", "nixl"):
        for mode in ("sync", "pin_sync", "async"):
            ttfts, rates, loaded = [], [], []
            for k in range(args.repeats):
                target = engine(model, blocks, 256 << 20)
                assert target.kv_tier is not None
                fetcher = KvFetcher(target.kv_tier, channel)  # type: ignore[arg-type]
                fetcher.fetch("warm", server.address, [], 10)  # connection and NIXL agent set-up
                pin = f"{channel}{mode}{k}" if mode == "pin_sync" else ""
                if pin:
                    source.kv_tier.pin(pin, source.prefix_keys(tokens))
                started = time.perf_counter()
                keys = target.prefix_keys(tokens)
                if mode == "async":  # the target starts at once and re-prefills what has not landed yet
                    future = fetcher.start("t", server.address, keys, 10, pin)
                    outputs, ttft = run(target, "r", prompt, 16, future, **prior)
                    outcome = future.result()
                else:
                    outcome = fetcher.fetch("t", server.address, keys, 10, pin, awaited=True)
                    outputs, ttft = run(target, "r", prompt, 16, **prior)
                    ttft = time.perf_counter() - started
                ttfts.append(ttft)
                loaded.append(target.status().num_tier_loaded_tokens)
                rates.append(outcome.num_bytes / max(outcome.seconds, 1e-9) / 1e9)
                assert outputs == reference, f"{channel}/{mode}: tokens differ from the re-prefill"
                fetcher.close()
                fetcher.join(5.0)
            results[f"ttft_{channel}_{mode}_s"] = statistics.median(ttfts)
            results[f"gbps_{channel}_{mode}"] = statistics.median(rates)
            results[f"loaded_tokens_{channel}_{mode}"] = statistics.median(loaded)
    results["block_bytes"] = float(outcome.num_bytes)
    results["raw_tcp_gbps"], results["raw_nixl_gbps"] = toy_raw_rates(outcome, args.repeats)
    server.close()
    return results


def toy_raw_rates(outcome: FetchOutcome, repeats: int) -> tuple[float, float]:
    piece_bytes = PIECE_BLOCKS * outcome.num_bytes // max(1, outcome.num_blocks)
    return raw_rates(outcome.num_bytes, repeats, piece_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--shared-prefix", type=int, default=400)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--user-tokens", type=int, default=32)
    parser.add_argument("--device-blocks", type=int, default=96, help="device KV blocks of 16 (fewer than sessions)")
    parser.add_argument("--reroute-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transfer-repeats", type=int, default=9, help="repeats of each transfer size (3.)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp)
        write_model(model, 4096)
        off = multi_turn(model, args, 0)
        on = multi_turn(model, args, 1 << 30)
        print(f"multi-turn  tier off: {off}")
        print(f"multi-turn  tier on : {on}")
        moved = reroute(model, args)
    for key, value in moved.items():
        print(f"re-route  {key} = {value:.4g}")
    table = transfer_table(args.transfer_repeats)
    saved = 1 - on["prefill_computed"] / max(1.0, off["prefill_computed"])
    best = min(moved["ttft_tcp_sync_s"], moved["ttft_nixl_sync_s"])
    ratio = best / moved["ttft_reprefill_s"]
    toy = max(moved["gbps_nixl_sync"] / moved["raw_nixl_gbps"], moved["gbps_tcp_sync"] / moved["raw_tcp_gbps"])
    print(f"RESULT prefill_saved={saved:.3f} reroute_ttft_vs_reprefill={ratio:.3f} "
          f"{transfer_fields(table)} transfer_vs_raw_toy={toy:.3f} "
          f"tier_speedup={off['seconds'] / on['seconds']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
