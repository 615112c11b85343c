"""Session gateway overhead: client-observed turn latency minus the engine's own time for the turn.

64 sessions (``--sessions``) talk to one gateway at once over loopback HTTP (keep-alive, as an
agent's client does), each for ``--turns`` chat turns of ``--max-tokens`` generated tokens, with
the embedded engine and the demo model behind the gateway in this process
(``psrl.gateway.local.EngineGateway``). Per turn, the engine's time is the wall time of the engine
steps that ran while the turn's request was in the engine; what remains of the latency is the
gateway's: HTTP, JSON, the hand-off to the sessions' thread, TITO rendering and tokenising, the
reply's parsing, and waiting for a step that had already started. Completions per second count
every answered turn over the wall time. Ends with
``RESULT overhead_p50_ms=... overhead_p99_ms=... completions_per_s=...``.

    .venv/bin/python tools/bench_gateway.py [--sessions 64] [--turns 8] [--max-tokens 1]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from typing import Any

import httpx

from psrl.gateway.local import EngineGateway
from psrl.gateway.sessions import Settings

DEMO = "psrl/assets/demo_model"
SWITCH_S = 0.0005  # the HTTP thread gets the interpreter promptly between the engine's steps


async def session(http: httpx.AsyncClient, turns: int, max_tokens: int) -> list[float]:
    sid = (await http.post("/sessions", json={})).json()["id"]
    messages = [{"role": "user", "content": "sum 1 2 3"}]
    overheads = []
    for turn in range(turns):
        started = time.perf_counter()
        answer = await http.post(
            f"/sessions/{sid}/v1/chat/completions",
            json={"model": "psrl", "messages": messages, "max_tokens": max_tokens},
        )
        latency_ms = (time.perf_counter() - started) * 1000
        answer.raise_for_status()
        overheads.append(latency_ms - float(answer.headers.get("x-psrl-engine-ms", 0.0)))
        reply = answer.json()["choices"][0]["message"]
        messages += [{"role": "assistant", "content": reply["content"] or ""}, {"role": "user", "content": f"n {turn}"}]
    return overheads


async def run(url: str, sessions: int, turns: int, max_tokens: int) -> tuple[list[float], float]:
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        started = time.perf_counter()
        results = await asyncio.gather(*(session(http, turns, max_tokens) for _ in range(sessions)))
        return [o for r in results for o in r], time.perf_counter() - started


def serve(max_tokens: int, urls: Any, stop: Any) -> None:
    """The gateway and its engine in a process of their own (the client's work does not share their GIL)."""
    import sys

    sys.setswitchinterval(SWITCH_S)
    with EngineGateway(DEMO, settings=Settings(max_turn_tokens=max(max_tokens, 1))) as gateway:
        urls.put(gateway.url)
        stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=1)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    urls, stop = context.Queue(), context.Event()
    server = context.Process(target=serve, args=(args.max_tokens, urls, stop), daemon=True)
    server.start()
    url = urls.get(timeout=300)
    try:
        asyncio.run(run(url, 4, 2, args.max_tokens))  # warm up: imports, first requests
        overheads, wall_s = asyncio.run(run(url, args.sessions, args.turns, args.max_tokens))
    finally:
        stop.set()
        server.join(timeout=30)
    overheads.sort()
    p50, p99 = statistics.median(overheads), overheads[min(len(overheads) - 1, int(0.99 * len(overheads)))]
    print(
        f"{len(overheads)} turns of {args.sessions} sessions in {wall_s:.2f} s; gateway overhead per turn "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )
    print(f"RESULT overhead_p50_ms={p50:.2f} overhead_p99_ms={p99:.2f} completions_per_s={len(overheads) / wall_s:.1f}")


if __name__ == "__main__":
    main()
