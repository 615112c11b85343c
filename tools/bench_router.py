"""Routing decision throughput: psrl's RouterCore against a straightforward linear-scan router.

Both routers place the same stream of requests on the same instances with the same policy and
the real staleness ledger, in steady state (a fixed number of requests in flight, a status
report every 64 decisions). The baseline does what a direct implementation of the selection
stages does: scan every instance, ask the ledger per instance, sort the candidates, evaluate the
policy per candidate through the cost-model methods, and keep one prefix tree per instance.
A second table times the request queue against a bare ``heapq`` of tuples (the floor).

    .venv/bin/python tools/bench_router.py [--instances 64] [--requests 20000] [--repeats 3]

Decisions per second are wall-clock (what the router sustains on this machine as it is); the
``(cpu)`` column divides by the CPU time of the benchmark process alone, which other work on a
shared machine disturbs less. Ends with one line ``RESULT decisions_per_s_<policy>=... ...``.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import get_args

from psrl.config.coordination import RoutingMethod, RoutingStrategy
from psrl.engine_cost.model import CostModel
from psrl.routing import InstanceSnapshot, RequestQueue, RouterCore, RoutingRequest, make_policy
from psrl.routing.prefix_tree import PrefixTree
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.types import LedgerSizes

POLICIES = get_args(RoutingMethod)
COST = CostModel(3.35e-8, 0.0064, 1.231e-4, 0.0028)
CHILDREN = 8
SYSTEM_PROMPT = tuple(range(50_000, 50_064))


def make_requests(count: int) -> list[RoutingRequest]:
    requests = []
    for rid in range(count):
        prompt = rid // CHILDREN
        body = tuple(range(100_000 + prompt * 256, 100_000 + prompt * 256 + 200))
        tokens = SYSTEM_PROMPT + body
        requests.append(RoutingRequest(rid, prompt, rid % CHILDREN, num_prompt_tokens=264, token_ids=tokens))
    return requests


def make_ledger(count: int) -> StalenessLedger:
    groups = count // CHILDREN + 1
    return StalenessLedger(LedgerSizes(1, groups, groups, CHILDREN, CHILDREN))


def copy_requests(requests: list[RoutingRequest]) -> list[RoutingRequest]:
    return [
        RoutingRequest(r.request_id, r.prompt_id, r.child_index, num_prompt_tokens=264, token_ids=r.token_ids)
        for r in requests
    ]


# -- baseline ----------------------------------------------------------------------------------


@dataclass
class NaiveInstance:
    instance_id: str
    version: int
    inflight: int = 0
    waiting: int = 0
    kv_tokens: int = 0
    capacity: int = 10_000_000
    tree: PrefixTree = field(default_factory=PrefixTree)


class NaiveRouter:
    """Selection stages written directly: per-instance scans, per-instance ledger calls, full sorts."""

    def __init__(self, method: str, ledger: StalenessLedger, instances: int, seed: int = 0) -> None:
        self.method, self.ledger = method, ledger
        self.instances = [NaiveInstance(f"i{k}", 0) for k in range(instances)]
        self.by_id = {inst.instance_id: inst for inst in self.instances}
        self.queue: list[tuple[int, RoutingRequest]] = []
        self.routed: dict[int, tuple[NaiveInstance, int]] = {}
        self.rng, self.cursor = random.Random(seed), 0

    def submit(self, request: RoutingRequest) -> None:
        self.queue.append((request.request_id, request))
        self.queue.sort(key=lambda item: item[0])

    def apply_snapshot(self, snap: InstanceSnapshot) -> None:
        inst = self.by_id[snap.instance_id]
        inst.waiting, inst.kv_tokens = snap.num_waiting, snap.kv_tokens

    def release(self, request_id: int) -> None:
        inst, _ = self.routed.pop(request_id)
        inst.inflight -= 1

    def dispatch(self) -> int:
        placed = 0
        while self.queue:
            _, request = self.queue[0]
            inst = self.select(request)
            if inst is None:
                break
            self.queue.pop(0)
            self.ledger.reserve(request.prompt_id, request.child_index, inst.version, inst.instance_id)
            request.version_tag = inst.version
            inst.inflight += 1
            inst.kv_tokens += request.num_tokens
            inst.tree.insert(request.token_ids, inst.instance_id, request.request_id)
            self.routed[request.request_id] = (inst, request.num_tokens)
            placed += 1
        return placed

    def select(self, request: RoutingRequest) -> NaiveInstance | None:
        cands = [i for i in self.instances if i.version >= request.version_tag]
        cands = [i for i in cands if self.ledger.can_reserve(request.prompt_id, i.version)]
        cands.sort(key=lambda i: (-i.version, self.instances.index(i)))
        cands = [i for i in cands if i.inflight < 1024 and i.waiting == 0]
        if not cands:
            return None
        return self.choose(request, cands)

    def choose(self, request: RoutingRequest, cands: list[NaiveInstance]) -> NaiveInstance | None:
        if self.method == "random":
            return self.rng.choice(cands)
        if self.method == "round_robin":
            inst = min(cands, key=lambda i: (self.instances.index(i) - self.cursor) % len(self.instances))
            self.cursor = self.instances.index(inst) + 1
            return inst
        if self.method == "request_num_balance":
            return min(cands, key=lambda i: i.inflight)
        if self.method.startswith("throughput_optimal"):
            gains = [COST.marginal_gain(i.inflight, i.kv_tokens, request.num_tokens) for i in cands]
            best = max(range(len(cands)), key=gains.__getitem__)
            return cands[best] if gains[best] >= 0.5 * COST.throughput(1, request.num_tokens) else None
        matches = [i.tree.match(request.token_ids).get(i.instance_id, 0) for i in cands]
        loads = [i.inflight for i in cands]
        if max(loads) - min(loads) > 16 and max(loads) > 1.5 * min(loads):
            return min(cands, key=lambda i: i.inflight)
        best = max(range(len(cands)), key=lambda k: (matches[k], -loads[k]))
        if matches[best] > 0:
            return cands[best]
        return min(cands, key=lambda i: i.tree.tenant_tokens(i.instance_id))


# -- drivers -----------------------------------------------------------------------------------


def run_psrl(method: str, requests: list[RoutingRequest], instances: int, window: int) -> tuple[float, float]:
    """(decisions per wall-clock second, decisions per CPU second of this process)."""
    config = RoutingStrategy(method=method)
    core = RouterCore(config, make_ledger(len(requests)), make_policy(config, COST))
    for k in range(instances):
        core.add_instance(f"i{k}", 0, 10_000_000)
    start, cpu_start = time.perf_counter(), time.process_time()
    for step, request in enumerate(requests):
        core.submit(request)
        core.dispatch(0.0)
        if step >= window:
            core.release(step - window)
        if step % 64 == 0:
            inst = core.instance(f"i{step // 64 % instances}")
            core.apply_snapshot(_snapshot(inst.instance_id, step, inst.num_inflight, core.next_dispatch_seq - 1))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return len(requests) / wall, len(requests) / cpu


def run_naive(method: str, requests: list[RoutingRequest], instances: int, window: int) -> float:
    router = NaiveRouter(method, make_ledger(len(requests)), instances)
    start = time.perf_counter()
    for step, request in enumerate(requests):
        router.submit(request)
        router.dispatch()
        if step >= window and step - window in router.routed:
            router.release(step - window)
        if step % 64 == 0:
            inst = router.instances[step // 64 % instances]
            router.apply_snapshot(_snapshot(inst.instance_id, step, inst.inflight, 0))
    return len(requests) / (time.perf_counter() - start)


def _snapshot(instance_id: str, seq: int, inflight: int, last_dispatch_seq: int) -> InstanceSnapshot:
    tokens = inflight * 264
    usage = tokens / 1e7
    return InstanceSnapshot(
        instance_id, seq, 0, inflight, 0, tokens, 10_000_000, usage, tokens, 0, 0.0, last_dispatch_seq
    )


def queue_ops(count: int, multi_level: bool) -> float:
    queue = RequestQueue(multi_level=multi_level)
    rng = random.Random(1)
    requests = [RoutingRequest(k, k, version_tag=rng.choice((-1, 0, 1, 2))) for k in range(count)]
    start = time.perf_counter()
    for r in requests:
        queue.push(r)
    while queue.pop() is not None:
        pass
    return 2 * count / (time.perf_counter() - start)


def heapq_ops(count: int) -> float:
    rng = random.Random(1)
    items = [(1, rng.choice((1 << 62, 0, 1, 2)), k, k) for k in range(count)]
    heap: list[tuple[int, int, int, int]] = []
    start = time.perf_counter()
    for item in items:
        heapq.heappush(heap, item)
    while heap:
        heapq.heappop(heap)
    return 2 * count / (time.perf_counter() - start)


def median_of(repeats: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--baseline-requests", type=int, default=4_000, help="the baseline is slow; fewer requests")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policies", nargs="*", default=list(POLICIES))
    args = parser.parse_args()
    window = 16 * args.instances
    requests = make_requests(args.requests)
    baseline_requests = make_requests(args.baseline_requests)
    print(f"{args.instances} instances, {window} requests in flight, median of {args.repeats} runs\n")
    print(f"{'policy':32s} {'psrl/s':>10s} {'(cpu)/s':>10s} {'baseline/s':>11s} {'ratio':>7s}")
    results: dict[str, float] = {}
    for method in args.policies:
        runs = [run_psrl(method, copy_requests(requests), args.instances, window) for _ in range(args.repeats)]
        ours, ours_cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        base = median_of(
            args.repeats, lambda m=method: run_naive(m, copy_requests(baseline_requests), args.instances, window)
        )
        results[f"decisions_per_s_{method}"] = ours
        results[f"cpu_decisions_per_s_{method}"] = ours_cpu
        results[f"baseline_decisions_per_s_{method}"] = base
        print(f"{method:32s} {ours:10.0f} {ours_cpu:10.0f} {base:11.0f} {ours / base:6.1f}x")
    ops = {
        name: median_of(args.repeats, lambda ml=ml: queue_ops(100_000, ml))
        for name, ml in (("single", False), ("mlq", True))
    }
    floor = median_of(args.repeats, lambda: heapq_ops(100_000))
    print(f"\n{'queue':32s} {'ops/s':>10s} {'heapq/s':>11s} {'ratio':>7s}")
    for name, value in ops.items():
        print(f"{name:32s} {value:10.0f} {floor:11.0f} {value / floor:6.2f}x")
    ours_min = min(v for k, v in results.items() if k.startswith("decisions_per_s"))
    fields = {**results, "queue_ops_per_s": ops["single"], "mlq_ops_per_s": ops["mlq"], "heapq_ops_per_s": floor}
    fields["min_decisions_per_s"] = ours_min
    print("RESULT " + " ".join(f"{k}={v:.0f}" for k, v in fields.items()) + f" instances={args.instances}")


if __name__ == "__main__":
    main()
