"""Routing decisions per second through the staleness ledger, against a slot-array baseline.

A routing decision for one child request = `reserve_indicator` for each candidate instance
version (4 candidates, as `candidate_sort_indicator=reserve_capability` does), then `reserve` on
the best. Around the decisions the driver keeps the ledger in steady state: groups finish and
occupy in dispatch order, and ready buffers are consumed, so buffers stay partly full.

The baseline keeps each buffer as an array of slots in the upstream layout
([OCCUPIED][EMPTY][RESERVED]), a prompt -> slot tracker, and finds statuses and free slots by
scanning, which is how the upstream inventory works (it caches statuses, but recomputes a status
by scanning the slots after every change). It implements only what the driver needs (no swap,
no aborts).

    .venv/bin/python tools/bench_ledger.py [--decisions 40000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Protocol

from psrl.staleness import LedgerSizes, StalenessLedger

EMPTY, RESERVED, OCCUPIED = 0, 1, 2


class Ledger(Protocol):
    @property
    def next_buffer_id(self) -> int: ...
    def reserve_indicator(self, prompt_id: int, version: int) -> float: ...
    def reserve(self, prompt_id: int, child: int, version: int, instance: str) -> int: ...
    def finish_child(self, prompt_id: int, child: int) -> object: ...
    def occupy(self, prompt_id: int) -> object: ...
    def is_ready(self, buffer_id: int) -> bool: ...
    def consume(self, buffer_id: int) -> object: ...


class ScanLedger:
    """Slot arrays searched linearly (the baseline)."""

    def __init__(self, sizes: LedgerSizes) -> None:
        self.sizes = sizes
        self.next_buffer_id = 0
        self.buffers: dict[int, list[tuple[int, int]]] = {}  # buffer -> slots of (category, prompt)
        self.versions: dict[int, int] = {}
        self.finished: dict[int, int] = {}
        self.tracker: dict[int, tuple[int, int]] = {}  # prompt -> (buffer, slot), as upstream's data_tracker

    def _slots(self, buffer_id: int) -> list[tuple[int, int]]:
        return self.buffers.setdefault(buffer_id, [(EMPTY, -1)] * self.sizes.num_slots)

    def _has_room(self, buffer_id: int) -> bool:
        slots = self._slots(buffer_id)
        occupied = sum(1 for c, _ in slots if c == OCCUPIED)
        return occupied < self.sizes.ready_entries and any(c == EMPTY for c, _ in slots)

    def _entry(self, prompt_id: int) -> tuple[int, int] | None:
        return self.tracker.get(prompt_id)

    def reserve_indicator(self, prompt_id: int, version: int) -> float:
        entry = self._entry(prompt_id)
        if entry is not None:
            return -math.inf if version + self.sizes.staleness >= entry[0] else math.inf
        for buffer_id in range(version + self.sizes.staleness, self.next_buffer_id - 1, -1):
            if self._has_room(buffer_id):
                return -float(buffer_id)
        return math.inf

    def reserve(self, prompt_id: int, child: int, version: int, instance: str) -> int:
        entry = self._entry(prompt_id)
        if entry is not None:
            self.versions[prompt_id] = min(self.versions[prompt_id], version)
            return entry[0]
        buffer_id = int(-self.reserve_indicator(prompt_id, version))
        slots = self._slots(buffer_id)
        index = max(i for i, (c, _) in enumerate(slots) if c == EMPTY)  # fill from the tail
        slots[index] = (RESERVED, prompt_id)
        self.tracker[prompt_id] = (buffer_id, index)
        self.versions[prompt_id] = version
        return buffer_id

    def finish_child(self, prompt_id: int, child: int) -> None:
        self.finished[prompt_id] = self.finished.get(prompt_id, 0) + 1

    def occupy(self, prompt_id: int) -> None:
        entry = self._entry(prompt_id)
        if entry is None:
            raise RuntimeError(f"prompt {prompt_id} holds no entry")
        self.buffers[entry[0]][entry[1]] = (EMPTY, -1)
        version = self.versions[prompt_id]
        for buffer_id in range(self.next_buffer_id, version + self.sizes.staleness + 1):
            if self._has_room(buffer_id):
                slots = self._slots(buffer_id)
                index = min(i for i, (c, _) in enumerate(slots) if c == EMPTY)
                slots[index] = (OCCUPIED, prompt_id)
                self.tracker[prompt_id] = (buffer_id, index)
                return
        raise RuntimeError(f"prompt {prompt_id} found no room")

    def is_ready(self, buffer_id: int) -> bool:
        return sum(1 for c, _ in self._slots(buffer_id) if c == OCCUPIED) >= self.sizes.ready_entries

    def consume(self, buffer_id: int) -> None:
        for _, prompt in self.buffers.pop(buffer_id):
            self.tracker.pop(prompt, None)
        self.next_buffer_id += 1


def drive(ledger: Ledger, sizes: LedgerSizes, num_decisions: int) -> tuple[float, int]:
    """Run the steady-state workload; returns (seconds, decisions made)."""
    instances = ("i0", "i1", "i2", "i3")
    in_flight: list[int] = []
    prompt_id = decisions = 0
    window = sizes.num_slots * (sizes.staleness + 1) // 2  # groups kept in flight
    started = time.perf_counter()
    while decisions < num_decisions:
        version = ledger.next_buffer_id
        candidates = (version, version, max(0, version - 1), max(0, version - 1))
        for child in range(sizes.redundant_rollout_n):
            indicators = [ledger.reserve_indicator(prompt_id, v) for v in candidates]
            best = min(range(len(candidates)), key=indicators.__getitem__)
            if indicators[best] == math.inf:
                break
            ledger.reserve(prompt_id, child, candidates[best], instances[best])
            decisions += 1
        else:
            in_flight.append(prompt_id)
        prompt_id += 1
        while len(in_flight) > window or (in_flight and decisions >= num_decisions):
            done = in_flight.pop(0)
            for child in range(sizes.alg_rollout_n):
                ledger.finish_child(done, child)
            ledger.occupy(done)
            while ledger.is_ready(ledger.next_buffer_id):
                ledger.consume(ledger.next_buffer_id)
    return time.perf_counter() - started, decisions


def measure(factory: type, sizes: LedgerSizes, num_decisions: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        seconds, decisions = drive(factory(sizes), sizes, num_decisions)
        rates.append(decisions / seconds)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = []
    print(f"{'groups/buffer':>13} {'eta':>3} {'ledger dec/s':>13} {'scan dec/s':>11} {'ratio':>7}")
    for entries in (64, 512, 4096):
        sizes = LedgerSizes(
            staleness=2, num_slots=entries, ready_entries=entries, alg_rollout_n=8, redundant_rollout_n=8
        )
        budget = args.decisions if entries < 4096 else args.decisions // 4
        ours = measure(StalenessLedger, sizes, args.decisions, args.repeats)
        scan = measure(ScanLedger, sizes, budget, args.repeats)
        results.append((entries, ours, scan))
        print(f"{entries:>13} {2:>3} {ours:>13,.0f} {scan:>11,.0f} {ours / scan:>7.1f}")
    fields = " ".join(
        f"ledger_dec_per_s_b{e}={o:.0f} scan_dec_per_s_b{e}={s:.0f} ratio_b{e}={o / s:.1f}" for e, o, s in results
    )
    print(f"RESULT {fields}")


if __name__ == "__main__":
    main()
