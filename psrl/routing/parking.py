"""Requests that cannot be placed until something specific changes.

A request deferred for a reason of its own (no instance at its version, the ledger cannot place
its prompt, its pinned instance is busy) is parked under the events that could change that
answer, instead of being retried on every dispatch pass. Those events wake it back into the
queue with its original arrival position. Wake keys:

* ``VERSIONS``: an instance was added, removed, re-versioned or became healthy;
* ``LEDGER``: the staleness ledger changed outside the router (occupy, consume, abort);
* ``LEDGER_ROOM``: a buffer gained room for new groups, or the next buffer moved (a prompt
  without a group yet waits on this, not on every ledger change: at scale most occupies free
  nothing, and re-deciding every parked group on each of them is quadratic);
* ``("prompt", p)``: a sibling of prompt ``p`` opened the group's reservation;
* ``("instance", i)``: instance ``i`` released a request, reported status, resumed or re-versioned.
  A release or a status report wakes the requests parked on ``i`` in turn, oldest first (see
  ``RouterCore._wake_in_turn``); the other events wake them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from psrl.routing.decision import Reason, RoutingDecision
from psrl.routing.request import RoutingRequest

WakeKey = tuple[str, ...] | tuple[str, int] | tuple[str, str]
VERSIONS: WakeKey = ("versions",)
LEDGER: WakeKey = ("ledger",)
LEDGER_ROOM: WakeKey = ("ledger_room",)


def prompt_key(prompt_id: int) -> WakeKey:
    return ("prompt", prompt_id)


def instance_key(instance_id: str) -> WakeKey:
    return ("instance", instance_id)


def wake_keys(
    decision: RoutingDecision,
    request: RoutingRequest,
    pinned_instance: str | None,
    restricted_to: list[str] | None,
    *,
    has_group: bool = True,
) -> list[WakeKey]:
    """Events that could let this deferred request through; empty when any capacity change could.

    ``restricted_to`` names the instances the request could use when that was fewer than all
    healthy ones (its version or its prompt's reservations ruled the others out): their being
    full says nothing about the rest, so it waits on them instead of holding up the queue.
    ``has_group``: the ledger already holds a group of the request's prompt (a refused child may
    join it after any change to it); without one only new room can help.
    """
    if decision.reason == Reason.NO_ELIGIBLE_VERSION:
        return [VERSIONS]
    keys: list[WakeKey] = []
    if decision.reason == Reason.NO_RESERVABLE and not has_group:
        keys = [LEDGER_ROOM, VERSIONS, prompt_key(request.prompt_id)]
    elif decision.reason in (Reason.NO_RESERVABLE, Reason.LEDGER_REFUSED):
        # A refused reserve call means the ledger changed under the decision: any change may help.
        keys = [LEDGER, VERSIONS, prompt_key(request.prompt_id)]
    if pinned_instance is not None:
        keys.append(instance_key(pinned_instance))
    elif not keys and restricted_to is not None:
        keys = [VERSIONS, LEDGER, *(instance_key(i) for i in restricted_to)]
    return keys


class ParkingLot:
    def __init__(self) -> None:
        self._parked: dict[int, tuple[RoutingRequest, int]] = {}  # request id -> (request, arrival seq)
        self._by_key: dict[WakeKey, set[int]] = {}
        self._keys_of: dict[int, list[WakeKey]] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._parked

    def park(self, request: RoutingRequest, arrival_seq: int, keys: Iterable[WakeKey]) -> None:
        self.remove(request.request_id)
        self._parked[request.request_id] = (request, arrival_seq)
        self._keys_of[request.request_id] = list(keys)
        for key in self._keys_of[request.request_id]:
            self._by_key.setdefault(key, set()).add(request.request_id)

    def remove(self, request_id: int) -> bool:
        if self._parked.pop(request_id, None) is None:
            return False
        for key in self._keys_of.pop(request_id):
            waiting = self._by_key.get(key)
            if waiting is not None:
                waiting.discard(request_id)
                if not waiting:
                    del self._by_key[key]
        return True

    def wake(self, key: WakeKey) -> list[tuple[RoutingRequest, int]]:
        """Un-park every request waiting on ``key`` (in arrival order, so replays agree)."""
        request_ids = sorted(self._by_key.get(key, ()))
        woken = [self._parked[rid] for rid in request_ids]
        for rid in request_ids:
            self.remove(rid)
        woken.sort(key=lambda item: item[1])
        return woken

    def wake_oldest(self, key: WakeKey) -> tuple[RoutingRequest, int] | None:
        """Un-park the earliest-arrived request waiting on ``key``, if any."""
        request_ids = self._by_key.get(key)
        if not request_ids:
            return None
        oldest = min(request_ids, key=lambda rid: self._parked[rid][1])
        item = self._parked[oldest]
        self.remove(oldest)
        return item

    def requests(self) -> Iterator[RoutingRequest]:
        return (request for request, _ in self._parked.values())
