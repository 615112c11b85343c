#!/usr/bin/env python3
"""psrl's bus against raw pyzmq + msgpack, side by side, in one run.

Every peer is its own spawned process, as actors are. Measured, each repeated and reported as
the median:

  pubsub   events/s one subscriber receives while one publisher sends flat out:
           raw PUB -> SUB with msgpack dicts (the baseline of shared/reference/zmq_bench.py),
           raw through the run's XSUB/XPUB proxy, and psrl's bus (typed events, envelope, proxy,
           typed decoding on receipt) for a small event and for 24 tokens of one request (``gen.tokens``).
  reqrep   round-trip time, one request outstanding: raw DEALER/ROUTER with msgpack dicts versus
           a bus link (envelopes; the answer names the request as its parent, which is checked).
  log      publisher throughput with and without the event logger subscribed, paced at
           50k events/s and flat out (the logger writes every event to segment files).

  python tools/bench_bus.py [--quick] [--repeats 3] [--transport ipc|tcp]

The last line is ``RESULT bus_vs_raw_pubsub=<ratio> bus_vs_raw_reqrep=<ratio> log_overhead=<fraction>
bus_vs_raw_pubsub_batched=<ratio>`` (pubsub: bus events/s, one event per message, over raw direct
events/s; reqrep: bus p50 RTT over raw p50 RTT; log: fraction of publisher throughput lost to the
logger at 50k events/s; batched: the pubsub ratio with publish_many batches).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bus.addresses import BusAddresses, plan_addresses
from bus.eventlog import EventLogger
from bus.link import Link
from bus.messages import Heartbeat, PullRequest, TokenBatch, TrainBatch, WeightsLoaded
from bus.proxy import BusProxy
from bus.publisher import Publisher
from bus.schema import Channel
from bus.sockets import SocketOptions
from bus.stamp import Cause
from bus.subscriber import Subscriber

NS = 1_000_000_000
UNBOUNDED = SocketOptions(hwm=0)  # like the baseline: nothing dropped, so counts compare
SPAWN = mp.get_context("spawn")


# ----------------------------------------------------------------------------- events
def raw_event(seq: int) -> dict[str, Any]:
    """The baseline's ~200-byte event (same fields as zmq_bench.make_event)."""
    return {
        "t": time.monotonic_ns(),
        "seq": seq,
        "kind": "rollout.step",
        "actor": "actor-0007",
        "episode": 123456,
        "step": seq % 4096,
        "reward": 0.125,
        "done": False,
        "tokens": list(range(24)),
        "meta": "x" * 62,
    }


TOKENS = np.arange(24, dtype=np.int32)
LOGPROBS = np.full(24, -0.5, dtype=np.float32)
VERSIONS = np.full(24, 3, dtype=np.int32)
COUNTS = np.asarray([24], dtype=np.int32)


def bus_event(kind: str, seq: int) -> Any:
    if kind == "small":
        return TrainBatch(seq, 123456, list(range(24)), 16, 4096, seq % 4096)
    return TokenBatch(
        request_ids=np.asarray([seq], np.int64),
        counts=COUNTS,
        token_ids=TOKENS,
        logprobs=LOGPROBS,
        versions=VERSIONS,
        instance="actor-0007",
    )


def bus_seq(message: Any) -> int:
    return message.step if isinstance(message, TrainBatch) else int(message.request_ids[0])


def free_address(transport: str, directory: str, name: str) -> str:
    if transport == "ipc":
        return f"ipc://{directory}/{name}.sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


# ----------------------------------------------------------------------------- processes
def proxy_proc(run_dir: str, transport: str, q: Any, stop: Any) -> None:
    proxy = BusProxy(plan_addresses(run_dir, transport), options=UNBOUNDED)  # type: ignore[arg-type]
    q.put(asdict(proxy.start()))
    stop.wait()
    proxy.stop()


def raw_sub_proc(address: str, n: int, q: Any) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.rcvhwm = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(address)
    q.put("ready")
    got, first = 0, None
    while got < n and sub.poll(10_000):
        event = msgpack.unpackb(sub.recv())
        if event.get("kind") == "warmup":
            continue
        first = first or time.monotonic_ns()
        got += 1
        if event["seq"] == n - 1:
            break
    q.put({"got": got, "span_ns": time.monotonic_ns() - (first or 0)})
    sub.close(0)
    ctx.term()


def raw_pub_proc(address: str, bind: bool, n: int, go: Any, q: Any) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.sndhwm = 0
    pub.bind(address) if bind else pub.connect(address)
    go.get()
    time.sleep(0.3)  # slow joiner, as in the baseline
    for _ in range(20):
        pub.send(msgpack.packb({"kind": "warmup", "seq": -1}))
    time.sleep(0.2)
    pack = msgpack.packb
    t0 = time.monotonic_ns()
    for i in range(n):
        pub.send(pack(raw_event(i)))
    q.put({"send_ns": time.monotonic_ns() - t0})
    time.sleep(0.5)
    pub.close(0)
    ctx.term()


def bus_sub_proc(address: str, n: int, q: Any) -> None:
    ctx = zmq.Context()
    sub = Subscriber(ctx, address, options=UNBOUNDED)
    q.put("ready")
    got, first = 0, None
    while got < n:
        event = sub.recv(10_000)
        if event is None:
            break
        if event.kind == "actor.heartbeat":
            continue
        first = first or time.monotonic_ns()
        got += 1
        if bus_seq(event.message) == n - 1:
            break
    q.put({"got": got, "span_ns": time.monotonic_ns() - (first or 0), "drops": sub.drops.total})
    sub.close()
    ctx.term()


def bus_pub_proc(addresses: dict[str, Any], kind: str, n: int, rate: int, batch: int, go: Any, q: Any) -> None:
    """Publish n events flat out (rate 0) or paced in 1 ms steps at `rate` events/s.

    batch > 1 sends them with publish_many, `batch` events per ZeroMQ message.
    """
    ctx = zmq.Context()
    pub = Publisher(ctx, BusAddresses(**addresses), "actor-0007", options=UNBOUNDED)
    go.get()
    pub.wait_subscribed(30, (Channel.EVENTS,))
    for _ in range(20):
        pub.publish(Heartbeat(state=1))
    time.sleep(0.3)
    messages = [bus_event(kind, i) for i in range(n)]  # built up front: measure the bus, not the caller
    t0 = time.monotonic_ns()
    if rate:
        per_step = max(1, rate // 1000)
        next_ns = t0
        for start in range(0, n, per_step):
            gap = next_ns - time.monotonic_ns()
            if gap > 0:
                time.sleep(gap / NS)
            for message in messages[start : start + per_step]:
                pub.publish(message)
            next_ns += NS // 1000
    elif batch > 1:
        for start in range(0, n, batch):
            pub.publish_many(messages[start : start + batch])
    else:
        for message in messages:
            pub.publish(message)
    q.put({"send_ns": time.monotonic_ns() - t0})
    time.sleep(0.5)
    pub.close()
    ctx.term()


def logger_proc(addresses: dict[str, Any], events_dir: str, q: Any, stop: Any) -> None:
    ctx = zmq.Context()
    logger = EventLogger(ctx, BusAddresses(**addresses), events_dir, options=UNBOUNDED, fsync="segment")
    stop_flag = threading.Event()
    thread = threading.Thread(target=logger.run, args=(stop_flag,))
    thread.start()
    q.put("ready")
    stop.wait()
    stop_flag.set()
    thread.join()
    q.put({"records": logger.writer.num_records, "bytes": logger.writer.num_bytes, "missing": logger.gaps.num_missing})
    ctx.term()


def raw_router_proc(address: str, q: Any) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.sndhwm = router.rcvhwm = 0
    router.bind(address)
    q.put("ready")
    while True:
        identity, body = router.recv_multipart()
        request = msgpack.unpackb(body)
        if request.get("op") == "stop":
            router.send_multipart([identity, msgpack.packb({"ok": True})])
            break
        router.send_multipart([identity, msgpack.packb({"id": request["id"], "ok": True, "value": request["id"] * 2})])
    time.sleep(0.2)
    router.close(0)
    ctx.term()


def bus_link_server_proc(address: str, q: Any) -> None:
    ctx = zmq.Context()
    cause = Cause()
    link = Link(ctx, address, sender="ps", serve=True, options=UNBOUNDED, cause=cause)
    q.put("ready")
    while True:
        link.socket.poll()
        received = link.recv()
        if received is None:
            continue
        peer, events = received
        for event in events:
            pull = event.message
            cause.event_id = event.envelope.event_id  # the answer names the request as its parent
            link.send(WeightsLoaded(instance=pull.instance, version=pull.version * 2), peer)
        if events and events[-1].message.version < 0:
            break
    time.sleep(0.2)
    link.close()
    ctx.term()


# ----------------------------------------------------------------------------- measurements
def _run(procs: list[Any]) -> None:
    for p in procs:
        p.start()


def _join(procs: list[Any]) -> None:
    for p in procs:
        p.join(120)


def run_raw_pubsub(transport: str, n: int, via_proxy: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        proxy_stop = SPAWN.Event()
        procs: list[Any] = []
        if via_proxy:
            q = SPAWN.Queue()
            procs.append(SPAWN.Process(target=proxy_proc, args=(tmp, transport, q, proxy_stop)))
            _run(procs)
            addresses = q.get(timeout=60)
            pub_address, sub_address, bind = addresses["events_in"], addresses["events_out"], False
        else:
            pub_address = sub_address = free_address(transport, tmp, "raw")
            bind = True
        go, pub_q, sub_q = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Queue()
        pub = SPAWN.Process(target=raw_pub_proc, args=(pub_address, bind, n, go, pub_q))
        pub.start()
        time.sleep(0.2)
        sub = SPAWN.Process(target=raw_sub_proc, args=(sub_address, n, sub_q))
        sub.start()
        sub_q.get(timeout=60)
        go.put("go")
        result = sub_q.get(timeout=600)
        pub_q.get(timeout=600)
        _join([pub, sub])
        proxy_stop.set()
        _join(procs)
    return result["got"] / (result["span_ns"] / NS)


def run_bus_pubsub(
    transport: str, kind: str, n: int, rate: int = 0, with_logger: bool = False, batch: int = 1
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        proxy_q, proxy_stop = SPAWN.Queue(), SPAWN.Event()
        proxy = SPAWN.Process(target=proxy_proc, args=(tmp, transport, proxy_q, proxy_stop))
        proxy.start()
        addresses = proxy_q.get(timeout=60)
        logger_q, logger_stop = SPAWN.Queue(), SPAWN.Event()
        logger = None
        if with_logger:
            logger = SPAWN.Process(target=logger_proc, args=(addresses, f"{tmp}/events", logger_q, logger_stop))
            logger.start()
            logger_q.get(timeout=60)
        go, pub_q, sub_q = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Queue()
        sub = SPAWN.Process(target=bus_sub_proc, args=(addresses["events_out"], n, sub_q))
        sub.start()
        sub_q.get(timeout=60)
        pub = SPAWN.Process(target=bus_pub_proc, args=(addresses, kind, n, rate, batch, go, pub_q))
        pub.start()
        go.put("go")
        received = sub_q.get(timeout=600)
        sent = pub_q.get(timeout=600)
        _join([pub, sub])
        out = {
            "recv_per_s": received["got"] / (received["span_ns"] / NS),
            "send_per_s": n / (sent["send_ns"] / NS),
            "received": received["got"],
        }
        if logger is not None:
            logger_stop.set()
            logged = logger_q.get(timeout=120)
            logger.join(60)
            out["logged"] = logged["records"]
        proxy_stop.set()
        proxy.join(60)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def run_raw_reqrep(transport: str, n: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        address = free_address(transport, tmp, "rr")
        q = SPAWN.Queue()
        server = SPAWN.Process(target=raw_router_proc, args=(address, q))
        server.start()
        q.get(timeout=60)
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(address)
        pack, unpack = msgpack.packb, msgpack.unpackb
        rtts = []
        for i in range(200 + n):
            t = time.monotonic_ns()
            dealer.send(pack({"op": "call", "id": i, "args": [1, 2, 3]}))
            reply = unpack(dealer.recv())
            if reply["id"] != i:
                raise RuntimeError("raw reply out of order")
            rtts.append(time.monotonic_ns() - t)
        dealer.send(pack({"op": "stop"}))
        dealer.recv()
        server.join(60)
        dealer.close(0)
        ctx.term()
    return rtts[200:]


def run_bus_reqrep(transport: str, n: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        address = free_address(transport, tmp, "rr")
        q = SPAWN.Queue()
        server = SPAWN.Process(target=bus_link_server_proc, args=(address, q))
        server.start()
        q.get(timeout=60)
        ctx = zmq.Context()
        client = Link(ctx, address, sender="rollout-0-ps", serve=False, identity="rollout-0", options=UNBOUNDED)
        rtts = []
        for i in range(200 + n):
            t = time.monotonic_ns()
            answer = _call(client, PullRequest(instance="rollout-0", version=i))
            rtts.append(time.monotonic_ns() - t)
            if answer.message.version != 2 * i:
                raise RuntimeError("bus answer does not match its request")
        _call(client, PullRequest(instance="rollout-0", version=-1))
        server.join(60)
        client.close()
        ctx.term()
    return rtts[200:]


def _call(client: Link, request: PullRequest) -> Any:
    """Send ``request`` and wait for the answer that names it as its parent."""
    envelope = client.send(request)
    while True:
        client.socket.poll()
        received = client.recv()
        if received is None:
            continue
        for event in received[1]:
            if envelope is not None and event.envelope.parent == envelope.event_id:
                return event


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


# ----------------------------------------------------------------------------- main
def bench_pubsub(args: argparse.Namespace, n: int) -> dict[str, float]:
    batch = args.batch
    runs: dict[str, Any] = {
        "raw direct": lambda: run_raw_pubsub(args.transport, n, via_proxy=False),
        "raw via proxy": lambda: run_raw_pubsub(args.transport, n, via_proxy=True),
        "bus small": lambda: run_bus_pubsub(args.transport, "small", n)["recv_per_s"],
        f"bus small x{batch}": lambda: run_bus_pubsub(args.transport, "small", n, batch=batch)["recv_per_s"],
        "bus chunk": lambda: run_bus_pubsub(args.transport, "chunk", n)["recv_per_s"],
        f"bus chunk x{batch}": lambda: run_bus_pubsub(args.transport, "chunk", n, batch=batch)["recv_per_s"],
    }
    rows: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):  # interleaved, so load changes hit every row alike
        for name, run in runs.items():
            rows[name].append(run())
    print(
        f"\npub/sub, {n} events, one publisher and one subscriber process ({args.transport}), median of {args.repeats}"
    )
    print("small = 100-byte event (TrainBatch), chunk = one request's 24 tokens as gen.tokens (5 arrays); xN = batches")
    print(f"{'path':<22}{'events/s':>12}{'vs raw direct':>16}   runs")
    base = median(rows["raw direct"])
    for name, values in rows.items():
        listed = " ".join(f"{v / 1000:.0f}k" for v in values)
        print(f"{name:<22}{median(values):>12,.0f}{median(values) / base:>16.2f}   {listed}")
    return {name: median(values) for name, values in rows.items()}


def bench_reqrep(args: argparse.Namespace, n: int) -> tuple[float, float]:
    raw: list[list[float]] = []
    bus: list[list[float]] = []
    for _ in range(args.repeats):
        raw.append(run_raw_reqrep(args.transport, n))
        bus.append(run_bus_reqrep(args.transport, n))
    print(f"\nrequest/reply, {n} sequential round trips ({args.transport}), median over {args.repeats} runs")
    print(f"{'path':<22}{'p50 us':>10}{'p99 us':>10}{'p50 vs raw':>12}")
    raw_p50 = median([pct(r, 50) / 1000 for r in raw])
    bus_p50 = median([pct(r, 50) / 1000 for r in bus])
    for name, runs, p50 in (("raw dealer/router", raw, raw_p50), ("bus link", bus, bus_p50)):
        p99 = median([pct(r, 99) / 1000 for r in runs])
        print(f"{name:<22}{p50:>10.1f}{p99:>10.1f}{p50 / raw_p50:>12.2f}")
    return raw_p50, bus_p50


def bench_log(args: argparse.Namespace, n: int) -> float:
    results: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.repeats):
        for rate in (50_000, 0):
            for with_logger in (False, True):
                key = f"{'paced 50k/s' if rate else 'flat out'}{' + logger' if with_logger else ''}"
                run = run_bus_pubsub(args.transport, "small", n, rate=rate, with_logger=with_logger)
                results.setdefault(key, []).append(run)
    print(
        f"\nevent log, {n} small events through the proxy to one subscriber ({args.transport}), "
        f"median of {args.repeats}"
    )
    print(f"{'run':<26}{'published/s':>13}{'received/s':>13}{'logged':>10}")
    for key, runs in results.items():
        logged = median([r.get("logged", float("nan")) for r in runs])
        sent, received = median([r["send_per_s"] for r in runs]), median([r["recv_per_s"] for r in runs])
        print(f"{key:<26}{sent:>13,.0f}{received:>13,.0f}{logged:>10.0f}")
    paced = median([r["send_per_s"] for r in results["paced 50k/s"]])
    paced_logged = median([r["send_per_s"] for r in results["paced 50k/s + logger"]])
    flat = median([r["send_per_s"] for r in results["flat out"]])
    flat_logged = median([r["send_per_s"] for r in results["flat out + logger"]])
    print(
        f"publisher throughput lost to the logger: paced {1 - paced_logged / paced:.3f}, "
        f"flat out {1 - flat_logged / flat:.3f}"
    )
    return 1 - paced_logged / paced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer events (smoke run)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    parser.add_argument("--batch", type=int, default=16, help="events per message in the batched rows")
    args = parser.parse_args()
    n_pubsub = 50_000 if args.quick else 200_000
    n_rtt = 2_000 if args.quick else 10_000
    n_log = 50_000 if args.quick else 200_000
    print(
        f"pyzmq {zmq.__version__} libzmq {zmq.zmq_version()} msgpack {msgpack.version} "
        f"python {sys.version.split()[0]} cpus {os.cpu_count()} load {os.getloadavg()[0]:.2f}"
    )
    rates = bench_pubsub(args, n_pubsub)
    raw_p50, bus_p50 = bench_reqrep(args, n_rtt)
    log_overhead = bench_log(args, n_log)
    single = rates["bus small"] / rates["raw direct"]
    batched = rates[f"bus small x{args.batch}"] / rates["raw direct"]
    print(
        f"RESULT bus_vs_raw_pubsub={single:.3f} bus_vs_raw_reqrep={bus_p50 / raw_p50:.3f} "
        f"log_overhead={log_overhead:.3f} bus_vs_raw_pubsub_batched={batched:.3f}"
    )


if __name__ == "__main__":
    main()
