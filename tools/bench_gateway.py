"""Session gateway overhead: client-observed turn latency minus the engine's own time for the turn.

64 sessions (``--sessions``) talk to one gateway at once over loopback HTTP/1.1 with keep-alive (as
an agent's client does), each for ``--turns`` chat turns of ``--max-tokens`` generated tokens. The
gateway runs in a process of its own with the embedded engine and the demo model behind it in
another (``psrl.gateway.local.EngineGateway`` with ``engine_process``: as in a run, the engine's
steps never hold the gateway's interpreter). The engine gets one torch thread (one core; the other
serves the gateway and the clients) and room in its KV cache for every session's prefix, with
steps of at most 256 batched tokens (``--batched-tokens``: its padded prefill grows with the
longest query of a step), so that short turns stay short. Its process runs at a lower priority
(``--engine-nice 10``): on two shared cores the gateway answers as soon as it has work, as it would
beside an engine on its own accelerator, rather than waiting out the engine's time slice.

Per turn, the engine's time (``x-psrl-engine-ms``) is its own request latency: from the hand-off to
its input queue to its result (the step in progress included: any frontend waits for it). What
remains of the client's latency is the gateway's: HTTP, JSON, TITO rendering and tokenising,
the reply's parsing, the hand-offs to and from the engine, and queueing behind other sessions'
calls. Completions per second count every answered turn over the wall time.

The client (``--client raw``, the default) is a minimal asyncio HTTP/1.1 client, so that on two
cores the measuring side takes as little CPU as possible; ``--client httpx`` uses httpx (what the
openai SDK uses), which costs the shared cores more. The baseline measured in the same run is the
HTTP floor: the same client's round trip to ``GET /health`` (no session work), one call at a time.

    .venv/bin/python tools/bench_gateway.py [--sessions 64] [--turns 8] [--max-tokens 1]

Ends with ``RESULT overhead_p50_ms=... overhead_p99_ms=... completions_per_s=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

DEMO = "psrl/assets/demo_model"
SWITCH_S = 0.0005  # the HTTP thread gets the interpreter promptly when another thread runs Python
KV_BLOCKS = 2048  # 32k tokens: every session's prefix stays cached, a turn prefills only its new tokens

Post = Callable[[str, dict[str, Any]], Awaitable[tuple[float, float, dict[str, Any]]]]


class RawClient(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: a request written at once, the answer read by its length.

    An answer's arrival is stamped in the transport's callback that completes it, not when its
    session's coroutine next runs: with 64 sessions on one client loop, that second wait is the
    client's own queue (its other sessions' JSON and next requests), not the gateway's time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[float, int, dict[str, str], bytes]] | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> RawClient:
        _, client = await asyncio.get_running_loop().create_connection(cls, host, port)
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answer = self._answer()
        if answer is not None and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((time.perf_counter(), *answer))

    def _answer(self) -> tuple[int, dict[str, str], bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self.buffer[:end].decode().split("\r\n")
        fields = (line.partition(":") for line in lines[1:] if line)
        headers = {name.strip().lower(): value.strip() for name, _, value in fields}
        size = end + 4 + int(headers["content-length"])
        if len(self.buffer) < size:
            return None
        raw = bytes(self.buffer[end + 4 : size])
        del self.buffer[:size]
        return int(lines[0].split()[1]), headers, raw

    async def request(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[float, dict[str, str], bytes]:
        """(arrival time, headers, body) of the answer."""
        assert self.transport is not None
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data)
        arrived, status, headers, raw = await self.waiter
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {raw.decode()}")
        return arrived, headers, raw

    async def post(self, path: str, body: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
        started = time.perf_counter()
        arrived, headers, raw = await self.request("POST", path, body)
        return (arrived - started) * 1000, float(headers.get("x-psrl-engine-ms", 0.0)), json.loads(raw)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def session(post: Post, turns: int, max_tokens: int) -> list[tuple[float, float]]:
    """(latency, engine time) of each turn."""
    sid = (await post("/sessions", {}))[2]["id"]
    messages = [{"role": "user", "content": "sum 1 2 3"}]
    timings = []
    for turn in range(turns):
        body = {"model": "psrl", "messages": messages, "max_tokens": max_tokens}
        latency_ms, engine_ms, answer = await post(f"/sessions/{sid}/v1/chat/completions", body)
        timings.append((latency_ms, engine_ms))
        reply = answer["choices"][0]["message"]
        messages += [{"role": "assistant", "content": reply["content"] or ""}, {"role": "user", "content": f"n {turn}"}]
    return timings


async def run_raw(url: str, sessions: int, turns: int, max_tokens: int) -> tuple[list[tuple[float, float]], float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    clients = [await RawClient.open(host, int(port)) for _ in range(sessions)]
    started = time.perf_counter()
    try:
        results = await asyncio.gather(*(session(c.post, turns, max_tokens) for c in clients))
    finally:
        for c in clients:
            c.close()
    return [t for r in results for t in r], time.perf_counter() - started


async def run_httpx(url: str, sessions: int, turns: int, max_tokens: int) -> tuple[list[tuple[float, float]], float]:
    import httpx

    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:

        async def post(path: str, body: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
            started = time.perf_counter()
            answer = await http.post(path, json=body)
            latency_ms = (time.perf_counter() - started) * 1000
            answer.raise_for_status()
            return latency_ms, float(answer.headers.get("x-psrl-engine-ms", 0.0)), answer.json()

        started = time.perf_counter()
        results = await asyncio.gather(*(session(post, turns, max_tokens) for _ in range(sessions)))
        return [t for r in results for t in r], time.perf_counter() - started


async def http_floor(url: str, calls: int = 200) -> float:
    """Median round trip of ``GET /health`` over one raw connection (the baseline)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    client = await RawClient.open(host, int(port))
    spent = []
    for _ in range(calls):
        started = time.perf_counter()
        arrived, _, _ = await client.request("GET", "/health", None)
        spent.append((arrived - started) * 1000)
    client.close()
    return statistics.median(spent)


def serve(max_tokens: int, batched_tokens: int, nice: int, urls: Any, stop: Any) -> None:
    """The gateway in a process of its own (the client's work does not share its interpreter)."""
    from psrl.gateway.local import EngineGateway
    from psrl.gateway.sessions import Settings

    sys.setswitchinterval(SWITCH_S)
    engine = {"num_kv_blocks": KV_BLOCKS, "max_num_batched_tokens": batched_tokens}
    settings = Settings(max_turn_tokens=max(max_tokens, 1))
    gateway = EngineGateway(
        DEMO, settings=settings, engine_process=True, torch_threads=1, engine_niceness=nice, engine=engine
    )
    with gateway:
        urls.put(gateway.url)
        stop.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--batched-tokens", type=int, default=256, help="the engine's max_num_batched_tokens")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw")
    parser.add_argument("--engine-nice", type=int, default=10, help="niceness added to the engine's process")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    urls, stop = context.Queue(), context.Event()
    server = context.Process(target=serve, args=(args.max_tokens, args.batched_tokens, args.engine_nice, urls, stop))
    server.start()
    url = urls.get(timeout=300)
    run = run_raw if args.client == "raw" else run_httpx
    try:
        asyncio.run(run(url, 4, 2, args.max_tokens))  # warm up: imports, first requests
        floor_ms = asyncio.run(http_floor(url))
        timings, wall_s = asyncio.run(run(url, args.sessions, args.turns, args.max_tokens))
    finally:
        stop.set()
        server.join(timeout=30)
    overheads = [latency - engine for latency, engine in timings]
    p50, p99 = statistics.median(overheads), percentile(overheads, 0.99)
    latency_p50 = statistics.median([latency for latency, _ in timings])
    engine_p50 = statistics.median([engine for _, engine in timings])
    print(
        f"{len(timings)} turns of {args.sessions} sessions in {wall_s:.2f} s ({args.client} client); per turn: "
        f"latency p50 {latency_p50:.2f} ms, engine p50 {engine_p50:.2f} ms, gateway overhead p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms; HTTP floor (GET /health, one at a time) {floor_ms:.2f} ms: overhead p50 "
        f"{p50 / floor_ms:.1f}x the floor"
    )
    print(
        f"RESULT overhead_p50_ms={p50:.2f} overhead_p99_ms={p99:.2f} completions_per_s={len(timings) / wall_s:.1f} "
        f"latency_p50_ms={latency_p50:.2f} engine_p50_ms={engine_p50:.2f} http_floor_ms={floor_ms:.2f}"
    )


if __name__ == "__main__":
    main()
