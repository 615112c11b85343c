"""The router's decision state machine: queue, instances, pins, selection and commit.

``RouterCore`` is what the router actor drives. Every state change comes in as a method call
(an event the actor also logs) and ``dispatch(now)`` returns the decisions. It reads no clock
and no random source of its own, so feeding the same events in the same order reproduces the
same decisions (``psrl replay --check``); each decision also carries the inputs its selection
read, so it can be re-derived on its own (``psrl.routing.replay``).

Commit rules: a first routing reserves a staleness slot at the chosen instance's version after
sync, which becomes the trajectory's V_traj; a continuation keeps its V_traj. The chosen
instance's in-flight count and token load grow at once, so decisions made before its next
status report already see the request.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from psrl.config.coordination import RoutingStrategy
from psrl.routing.budget import budget_request_tokens
from psrl.routing.cluster import Cluster
from psrl.routing.decision import DecisionInputs, LedgerAnswer, Reason, RoutingDecision
from psrl.routing.instance import CandidateState, InstanceSnapshot
from psrl.routing.ledger import LedgerQueries
from psrl.routing.offload import OffloadTierView
from psrl.routing.parking import (
    LEDGER,
    LEDGER_ROOM,
    VERSIONS,
    ParkingLot,
    WakeKey,
    instance_key,
    prompt_key,
    wake_keys,
)
from psrl.routing.policies.base import RoutingPolicy
from psrl.routing.prefix_tree import PrefixTree
from psrl.routing.queue import RequestQueue
from psrl.routing.request import RoutingRequest
from psrl.routing.selector import Selection, SelectionSettings, select
from psrl.routing.servable import ServableCounts, count_servable


@dataclass(frozen=True, slots=True)
class DispatchResult:
    routed: list[RoutingDecision]
    deferred: list[RoutingDecision]  # requests tried in this pass that stay queued, with why


@dataclass(slots=True)
class _Routed:
    request: RoutingRequest
    instance_id: str


class RouterCore:
    def __init__(
        self,
        settings: RoutingStrategy,
        ledger: LedgerQueries,
        policy: RoutingPolicy,
        *,
        offload_tier: OffloadTierView | None = None,
        record_inputs: bool = True,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.policy = policy
        self.offload_tier = offload_tier
        self.record_inputs = record_inputs
        self.selection = SelectionSettings.from_config(settings)
        self.queue = RequestQueue(
            multi_level=settings.enable_multi_priority_queue, sort_indicator=settings.request_sort_indicator
        )
        self.cluster = Cluster()
        self.tree = PrefixTree()
        self.parking = ParkingLot()
        # instance wakes in turn (see _wake_in_turn): the request each instance key's turn is at
        self._turn_holder: dict[WakeKey, int] = {}
        self._turn_of: dict[int, WakeKey] = {}
        self._room = ledger.room_signature()
        self.is_paused = False
        self._routed: dict[int, _Routed] = {}
        self._group_pins: dict[int, str] = {}
        self._resting: dict[int, str] = {}  # session (request id) -> instance its next turn comes back to
        self._group_active: dict[int, int] = {}
        self._decision_seq = 0
        self._dispatch_seq = 0
        self._stamp = 0
        self._rr_cursor = 0
        self._last_eviction_s: float | None = None

    # -- instance events -----------------------------------------------------------------------

    def add_instance(self, instance_id: str, version: int, kv_capacity_tokens: int = 0) -> None:
        self.cluster.add(instance_id, version, kv_capacity_tokens)
        self._wake(VERSIONS)

    def remove_instance(self, instance_id: str) -> list[RoutingRequest]:
        """Forget a dead instance; returns the requests that were on it (to be looped back)."""
        self.cluster.remove(instance_id)
        self.tree.remove_tenant(instance_id)
        for request_id in [r for r, i in self._resting.items() if i == instance_id]:
            del self._resting[request_id]
        orphans = [r.request for r in self._routed.values() if r.instance_id == instance_id]
        for request in orphans:
            self.release(request.request_id)
        for prompt_id in [p for p, i in self._group_pins.items() if i == instance_id]:
            del self._group_pins[prompt_id]
        self._wake(VERSIONS, instance_key(instance_id))
        return orphans

    def rest(self, request_id: int, instance_id: str) -> None:
        """A session's turn ended on ``instance_id`` and its next turn will come back there (sticky): it
        counts in that instance's load for new sessions (``CandidateState.num_resting``) until ``wake``."""
        self.wake(request_id)
        view = self.cluster.find(instance_id)
        if view is None:
            return
        self._resting[request_id] = instance_id
        view.num_resting += 1
        self.cluster.changed(view)

    def wake(self, request_id: int) -> None:
        """The session's next turn arrived, or the session ended: it no longer rests anywhere."""
        instance_id = self._resting.pop(request_id, None)
        view = None if instance_id is None else self.cluster.find(instance_id)
        if view is not None:
            view.num_resting = max(0, view.num_resting - 1)
            self.cluster.changed(view)

    def set_version(self, instance_id: str, version: int) -> None:
        """The instance advertises ``version`` after a sync; its GPU prefix cache is gone."""
        view = self.cluster.view(instance_id)
        if version != view.version:
            view.version = version
            self.cluster.changed(view, health_or_version=True)
            self.tree.remove_tenant(instance_id)
            self._wake(VERSIONS, instance_key(instance_id))

    def set_paused(self, instance_id: str, is_paused: bool) -> None:
        view = self.cluster.view(instance_id)
        view.is_paused = is_paused
        self.cluster.changed(view)
        if not is_paused:
            self._wake(instance_key(instance_id))

    def set_healthy(self, instance_id: str, is_healthy: bool) -> None:
        view = self.cluster.view(instance_id)
        view.is_healthy = is_healthy
        self.cluster.changed(view, health_or_version=True)
        if is_healthy:
            self._wake(VERSIONS, instance_key(instance_id))

    def apply_snapshot(self, snapshot: InstanceSnapshot) -> bool:
        """Merge an engine status report; False when it is unknown, old or repeated."""
        view = self.cluster.find(snapshot.instance_id)
        if view is None or not view.apply_snapshot(snapshot):
            return False
        self.cluster.changed(view)
        self._wake_in_turn(instance_key(snapshot.instance_id))
        return True

    def notify_ledger_changed(self) -> None:
        """The ledger changed outside the router (occupy, consume, abort): retry what it refused."""
        self._wake(LEDGER)
        self._check_room()

    def _check_room(self) -> None:
        """Wake prompts waiting for new room when the ledger gained some since the last look.

        Called on every notified change and after every dispatch pass (within a pass, room only
        shrinks), so a gain is seen even when the change itself was not notified.
        """
        room = self.ledger.room_signature()
        previous, self._room = self._room, room
        if room[0] != previous[0] or previous[1] - room[1]:
            self._wake(LEDGER_ROOM)

    def instance(self, instance_id: str) -> CandidateState:
        return self.cluster.view(instance_id).candidate()

    def instances(self) -> list[CandidateState]:
        return [view.candidate() for view in self.cluster]

    # -- request events ------------------------------------------------------------------------

    def submit(self, request: RoutingRequest) -> None:
        """Queue a new request or a loopback (a continuation keeps its version tag)."""
        if request.request_id in self._routed:
            raise ValueError(f"request {request.request_id} is still routed; release it before resubmitting")
        self.parking.remove(request.request_id)
        self.queue.push(request)

    def abort(self, request_id: int) -> bool:
        """Drop a waiting request or release a routed one; returns whether it was known."""
        if self.queue.remove(request_id) or self.parking.remove(request_id):
            self._end_turn(request_id)
            return True
        return self.release(request_id) is not None

    def release(self, request_id: int) -> str | None:
        """The request left its instance (finished, aborted or interrupted); returns that instance."""
        routed = self._routed.pop(request_id, None)
        if routed is None:
            return None
        view = self.cluster.find(routed.instance_id)
        if view is not None:
            view.on_released()
            self.cluster.changed(view)
            self._wake_in_turn(instance_key(routed.instance_id))
        prompt_id = routed.request.prompt_id
        if prompt_id in self._group_active:
            self._group_active[prompt_id] -= 1
            if self._group_active[prompt_id] <= 0:
                del self._group_active[prompt_id]
                self._group_pins.pop(prompt_id, None)
        return routed.instance_id

    def loop_back(self, request_id: int, num_response_tokens: int, token_ids: tuple[int, ...] = ()) -> RoutingRequest:
        """An interrupted request re-enters the queue with its instance as hint and its new length."""
        routed = self._routed.get(request_id)
        if routed is None:
            raise KeyError(f"request {request_id} is not routed")
        self.release(request_id)
        request = routed.request
        request.hint_instance = routed.instance_id
        request.num_response_tokens = num_response_tokens
        if token_ids:
            request.token_ids = token_ids
        self.submit(request)
        return request

    def routed_instance(self, request_id: int) -> str | None:
        routed = self._routed.get(request_id)
        return routed.instance_id if routed else None

    def routed_requests(self, instance_id: str) -> list[int]:
        return [rid for rid, r in self._routed.items() if r.instance_id == instance_id]

    def queued(self) -> Iterator[RoutingRequest]:
        """Every request waiting for an instance (queued or parked), in no particular order."""
        yield from self.queue.requests()
        yield from self.parking.requests()

    def servable_counts(self, versions: list[int]) -> dict[int, ServableCounts]:
        """Queued work each version could still take (the coordinator's sync and migration facts)."""
        return count_servable(self.queued(), self.ledger, versions)

    @property
    def num_queued(self) -> int:
        return len(self.queue) + len(self.parking)

    @property
    def next_dispatch_seq(self) -> int:
        """Sequence number the next routed request carries to its engine (echoed in snapshots)."""
        return self._dispatch_seq

    def pause(self) -> None:
        self.is_paused = True

    def resume(self) -> None:
        self.is_paused = False

    # -- decisions -----------------------------------------------------------------------------

    def dispatch(self, now: float, max_decisions: int | None = None) -> DispatchResult:
        """Try queued requests in priority order until one is refused for lack of capacity.

        A request refused for a reason of its own (no instance at its version, the ledger, a busy
        pinned instance, or only some instances open to it and those full) is parked until an
        event can change that answer, and the pass goes on. A request that every healthy
        instance was open to, refused because none admits it or gains from it, stays at the
        head: everything behind it waits too, as in a strict priority queue. ``now`` (seconds,
        from the triggering event) only paces prefix-tree eviction.
        """
        routed: list[RoutingDecision] = []
        deferred: list[RoutingDecision] = []
        if self.is_paused:
            return DispatchResult(routed, deferred)
        self._maybe_evict(now)
        self._check_room()  # room gained by changes nobody notified competes in this pass
        while max_decisions is None or len(routed) + len(deferred) < max_decisions:
            item = self.queue.pop()
            if item is None:
                break
            request, arrival = item
            decision, pinned_instance, restricted_to = self._decide(request)
            if decision.is_routed:
                routed.append(decision)
                self._end_turn(request.request_id)
                continue
            deferred.append(decision)
            has_group = self.ledger.has_group(request.prompt_id)
            keys = wake_keys(decision, request, pinned_instance, restricted_to, has_group=has_group)
            if not keys:
                self.queue.push(request, arrival)
                break
            self.parking.park(request, arrival, keys)
            self._end_turn(request.request_id, keys)
        self._check_room()  # the pass's reservations shrank the room: later gains compare with this
        return DispatchResult(routed, deferred)

    def decide(self, request: RoutingRequest) -> RoutingDecision:
        """Select an instance for one (already dequeued) request and commit the choice."""
        return self._decide(request)[0]

    def gather_inputs(self, request: RoutingRequest) -> DecisionInputs:
        """Everything selection reads for this request, copied out of the current state."""
        cands = self.cluster.candidates(request.version_tag)
        seq = self._decision_seq
        self._decision_seq += 1
        hint = request.hint_instance if (request.is_sticky or request.force_pin_once) else None
        group = self._group_pins.get(request.prompt_id) if self.settings.enable_group_sticky else None
        gpu, offload, trees = self._prefix_inputs(request, cands)
        ledger = self._ledger_answers(request)
        # The request is copied: commit and loopbacks mutate the live one, the record must not change.
        copy = msgspec.structs.replace(request)
        return DecisionInputs(
            seq, copy, cands, self.cluster.num_slots, hint, group, ledger, gpu, offload, trees, self._rr_cursor
        )

    def _decide(self, request: RoutingRequest) -> tuple[RoutingDecision, str | None, list[str] | None]:
        """The decision, the instance the request was pinned to (if any), and the instances it was
        restricted to when fewer than all healthy ones were open to it."""
        inputs = self.gather_inputs(request)
        selection = select(inputs, self.selection, self.policy)
        pinned = {"hint": inputs.hint_pin, "group": inputs.group_pin}.get(selection.pinned_by)
        if selection.choice is None:
            restricted = None
            if selection.considered and len(selection.considered) < self.cluster.num_healthy:
                restricted = [inputs.candidates[i].instance_id for i in selection.considered]
            return self._record(inputs, selection, None, None, None), pinned, restricted
        cand = inputs.candidates[selection.choice.index]
        hint = request.hint_instance
        moved_from = hint if hint is not None and hint != cand.instance_id else None
        try:
            buffer = self._reserve(request, cand)
        except Exception as exc:  # an injected ledger's refusal must not lose the request
            refused = Selection(None, Reason.LEDGER_REFUSED, selection.pinned_by)
            decision = self._record(inputs, refused, None, None, None)
            return msgspec.structs.replace(decision, detail=f"{type(exc).__name__}: {exc}"), pinned, None
        self._commit(request, cand)
        return self._record(inputs, selection, cand.instance_id, buffer, moved_from), pinned, None

    def _record(
        self,
        inputs: DecisionInputs,
        selection: Selection,
        instance_id: str | None,
        buffer: int | None,
        moved_from: str | None,
    ) -> RoutingDecision:
        request, choice = inputs.request, selection.choice  # the request as it was before the commit
        version_tag = self._routed[request.request_id].request.version_tag if instance_id else request.version_tag
        return RoutingDecision(
            inputs.seq, request.request_id, request.prompt_id, selection.reason, instance_id, version_tag,
            buffer, selection.pinned_by, choice.group if choice else -1, choice.score if choice else 0.0,
            choice.detail if choice else "", moved_from, self._dispatch_seq - 1 if instance_id else -1,
            inputs if self.record_inputs else None,
        )  # fmt: skip

    def _ledger_answers(self, request: RoutingRequest) -> tuple[LedgerAnswer, ...]:
        if not request.is_unversioned:
            return ()
        use_indicator = self.selection.candidate_sort_indicator == "reserve_capability"
        answers = []
        for version in self.cluster.versions(request.version_tag):
            can = self.ledger.can_reserve(request.prompt_id, version)
            indicator = self.ledger.reserve_indicator(request.prompt_id, version) if use_indicator and can else 0.0
            answers.append(LedgerAnswer(version, can, indicator))
        return tuple(answers)

    def _prefix_inputs(
        self, request: RoutingRequest, cands: tuple[CandidateState, ...]
    ) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        if not self.policy.uses_prefix_tree:
            return {}, {}, {}
        trees = dict(self.tree.tokens_by_tenant)
        offload: dict[str, int] = {}
        if self.policy.uses_offload_tier and self.offload_tier is not None:
            offload = {k: v for k, v in self.offload_tier.match(request.token_ids).items() if v > 0}
        return self.tree.match(request.token_ids), offload, trees

    def _reserve(self, request: RoutingRequest, cand: CandidateState) -> int | None:
        """First routing: reserve the staleness slot at the instance's version (the only step that can fail)."""
        if not request.is_unversioned:
            return None
        return self.ledger.reserve(request.prompt_id, request.child_index, cand.version, cand.instance_id)

    def _commit(self, request: RoutingRequest, cand: CandidateState) -> None:
        if request.is_unversioned:
            request.version_tag = cand.version  # V_traj is fixed here, for the trajectory's whole life
            self._wake(prompt_key(request.prompt_id))
        budget = budget_request_tokens(
            request.num_prompt_tokens, request.num_response_tokens, self.settings.request_budget
        )
        view = self.cluster.view(cand.instance_id)
        view.on_routed(self._dispatch_seq, request.num_tokens, budget)
        self.cluster.changed(view)
        self._dispatch_seq += 1
        self._routed[request.request_id] = _Routed(request, cand.instance_id)
        request.force_pin_once = False
        if self.settings.enable_group_sticky:
            self._group_pins.setdefault(request.prompt_id, cand.instance_id)
            self._group_active[request.prompt_id] = self._group_active.get(request.prompt_id, 0) + 1
        if self.policy.uses_prefix_tree and request.token_ids:
            self._stamp += 1
            self.tree.insert(request.token_ids, cand.instance_id, self._stamp)
        self._rr_cursor = cand.order + 1

    def _wake(self, *keys: WakeKey) -> None:
        for key in keys:
            for request, arrival in self.parking.wake(key):
                self.queue.push(request, arrival)

    def _wake_in_turn(self, key: WakeKey) -> None:
        """Wake the requests parked on an instance one at a time, in arrival order.

        A release or a status report frees room on one instance. Waking every request parked on
        it would re-decide them all, and all but the first few would park again on it (quadratic
        in the parked requests). Instead the oldest is woken, and when it has been decided the
        next one is, unless it parked on this instance again (the instance is full again).
        """
        if key in self._turn_holder:
            return  # a turn on this instance is under way: it goes on from its current request
        item = self.parking.wake_oldest(key)
        if item is not None:
            self._turn_holder[key] = item[0].request_id
            self._turn_of[item[0].request_id] = key
            self.queue.push(*item)

    def _end_turn(self, request_id: int, parked_on: list[WakeKey] | None = None) -> None:
        """``request_id`` was decided (``parked_on``: the keys it parked on again) or left the queue."""
        key = self._turn_of.pop(request_id, None)
        if key is None:
            return
        del self._turn_holder[key]
        if parked_on is None or key not in parked_on:
            self._wake_in_turn(key)

    def _maybe_evict(self, now: float) -> None:
        if not self.policy.uses_prefix_tree:
            return
        interval = self.settings.cache_aware_policy.eviction_interval_secs
        if self._last_eviction_s is not None and now - self._last_eviction_s < interval:
            return
        self._last_eviction_s = now
        for view in self.cluster:
            self.tree.evict(view.instance_id, self.settings.cache_aware_policy.max_tree_size)
