"""The router's request queue: one priority heap, or the multi-level queue (MLQ) by version.

Priority, most significant first:

* single heap: (validation first, trajectory version ascending, sort key, arrival);
* MLQ: one heap per trajectory version, scanned in ascending version, each ordered by
  (validation first, sort key, arrival); the version partition outranks even validation.

Unversioned requests (not yet routed) rank after every versioned one, so continuations of
older trajectories drain first in both modes. The sort key is ``request_sort_indicator``:
``small_id`` (request id), ``short_length`` (context tokens) or ``long_length`` (negated).
Removal is lazy: a removed request's heap entry is skipped when it surfaces.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from typing import Literal

from psrl.routing.request import UNVERSIONED, RoutingRequest

SortIndicator = Literal["small_id", "short_length", "long_length"]
_UNVERSIONED_RANK = 1 << 62  # sorts after every real version
# heap entry: (validation rank, version rank, sort key, arrival seq, request)
_Entry = tuple[int, int, int, int, RoutingRequest]


def _sort_key(request: RoutingRequest, indicator: SortIndicator) -> int:
    if indicator == "small_id":
        return request.request_id
    if indicator == "short_length":
        return request.num_tokens
    if indicator == "long_length":
        return -request.num_tokens
    raise ValueError(f"unknown request_sort_indicator {indicator!r}")


def _version_rank(request: RoutingRequest) -> int:
    return _UNVERSIONED_RANK if request.version_tag == UNVERSIONED else request.version_tag


class RequestQueue:
    """Queued requests in routing order; ``pop`` returns the next one to try."""

    def __init__(self, *, multi_level: bool = False, sort_indicator: SortIndicator = "small_id") -> None:
        _sort_key(RoutingRequest(0, 0), sort_indicator)  # refuse an unknown indicator now
        self.multi_level = multi_level
        self.sort_indicator: SortIndicator = sort_indicator
        self._heap: list[_Entry] = []
        self._levels: dict[int, list[_Entry]] = {}
        self._level_keys: list[int] = []  # sorted version ranks with a heap in _levels
        self._live: dict[int, int] = {}  # request_id -> arrival seq of its live entry
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._live

    def push(self, request: RoutingRequest, arrival_seq: int | None = None) -> int:
        """Queue a request (replacing a queued entry with the same id); returns its arrival seq.

        A request put back after a failed selection passes its old ``arrival_seq`` so it keeps
        its place among equals.
        """
        if arrival_seq is None:
            arrival_seq = self._next_seq
            self._next_seq += 1
        entry: _Entry = (
            0 if request.is_validate else 1,
            _version_rank(request),
            _sort_key(request, self.sort_indicator),
            arrival_seq,
            request,
        )
        self._live[request.request_id] = arrival_seq
        if self.multi_level:
            self._push_level(entry)
        else:
            heapq.heappush(self._heap, entry)
        return arrival_seq

    def pop(self) -> tuple[RoutingRequest, int] | None:
        """Remove and return the highest-priority request with its arrival seq, or None when empty."""
        while True:
            entry = self._pop_level() if self.multi_level else (heapq.heappop(self._heap) if self._heap else None)
            if entry is None:
                return None
            request, seq = entry[4], entry[3]
            if self._live.get(request.request_id) == seq:
                del self._live[request.request_id]
                return request, seq

    def remove(self, request_id: int) -> bool:
        """Drop a queued request (e.g. aborted); returns whether it was queued."""
        return self._live.pop(request_id, None) is not None

    def requests(self) -> Iterator[RoutingRequest]:
        """Queued requests in no particular order."""
        heaps = self._levels.values() if self.multi_level else (self._heap,)
        for heap in heaps:
            for entry in heap:
                if self._live.get(entry[4].request_id) == entry[3]:
                    yield entry[4]

    def level_sizes(self) -> dict[int, int]:
        """Queued requests per trajectory version (``UNVERSIONED`` for unrouted ones)."""
        sizes: dict[int, int] = {}
        for request in self.requests():
            sizes[request.version_tag] = sizes.get(request.version_tag, 0) + 1
        return sizes

    def _push_level(self, entry: _Entry) -> None:
        rank = entry[1]
        heap = self._levels.get(rank)
        if heap is None:
            heap = self._levels[rank] = []
            bisect.insort(self._level_keys, rank)
        # Inside a level the order is (validation, sort key, arrival): the rank slot is constant.
        heapq.heappush(heap, entry)

    def _pop_level(self) -> _Entry | None:
        while self._level_keys:
            rank = self._level_keys[0]
            heap = self._levels[rank]
            if heap:
                return heapq.heappop(heap)
            del self._levels[rank]
            self._level_keys.pop(0)
        return None
