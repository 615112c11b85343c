"""Session strategy: ThunderAgent-style hang / continue of multi-turn sessions.

A multi-turn session holds its prefix KV on its pinned instance across turns, while it is
generating (``generate``) and while it calls its environment (``env``). Per instance with
capacity ``total`` KV tokens, of which ``used`` are measured in use, and running sessions R::

    shared       = max(0, sum(tokens of generate sessions in R) - used)      # prefix sharing credit
    remaining(H) = total - (sum over generate sessions in R - H of tokens
                            + env_token_weight * sum over env sessions in R - H of tokens
                            - shared + buffer_per_session * |R - H|)

``env_token_weight`` is 0 by default with the KV offload tier on: the blocks a resting session
gives up go to the tier and come back by a copy, so they need no room kept for them (the agent
benchmark's figures are in docs/benchmarks.md).

``shared`` is fixed for the tick. When ``remaining`` (nothing hung) is negative, sessions are
hung until it is not: env sessions first (already off the GPU, cheapest to shed), then generate
sessions, smallest first. Hanging never aborts a turn: the session router blocks its next turn.

Hung sessions come back when there is room: ``bucketed`` readmits each instance's own hung
sessions smallest first while ``tokens + buffer_per_session`` fits its remaining capacity (sessions
hung on an instance no longer in the capacity view, scaled down or lost, are placed as ``global`` does);
``global`` takes the largest smallest-first set of hung sessions that fits the total remaining
capacity of instances with room and places them largest first on the instance with the most
remaining capacity (best-fit decreasing). ``continue_force_pin`` pins the next turn of a
continued session to the instance chosen for it, once. Ties break by session id, so decisions
are deterministic.

With ``max_hang_s`` > 0, sessions hung at least that long (overdue) go first, oldest first, and
nothing passes an overdue session that does not fit yet: under ``bucketed`` the room its instance
frees is kept for it, so it waits at most ``max_hang_s`` plus the time that room takes to free
(``global`` keeps the order but may still place a smaller session where the overdue one does not
fit). Smallest first alone lets a large session wait as long as smaller ones keep fitting.

Among the rest, sessions whose next turn is ready (``waiting_s`` > 0: its environment answered
while it was hung, so the turn waits here) come before those still at their environment, the one
waiting longest first; one that does not fit is passed by smaller ones. Room given to a session
still calling its tool buys nothing until the tool answers, while a ready turn's wait is time to
its first token: this order spends the room where a turn is waiting. Without ready turns the order
is smallest first, as before. With ``max_ready_wait_s`` > 0, a ready turn that has waited that long
and still does not fit is continued anyway on its instance, by hanging sessions there that are at
their environment (smallest first, as many as make its room): its wait is bounded by that plus a
tick wherever sessions at their environment hold the room, at the price of the working set that
hanging keeps small (ThunderAgent's gain). ``ready_first=false`` restores smallest first only.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from psrl.config.coordination import ThunderAgent


class SessionInfo(msgspec.Struct, frozen=True, gc=False):
    session_id: str
    instance_id: str | None  # pinned instance; unpinned sessions are not scheduled
    status: Literal["generate", "env"]
    hang_state: Literal["running", "hung"]
    total_tokens: int
    is_closing: bool = False
    hung_for_s: float = 0.0  # how long the session has been hung at this tick (0: not hung)
    waiting_s: float = 0.0  # how long its next turn has been ready and held (0: none ready)


class InstanceCapacity(msgspec.Struct, frozen=True, gc=False):
    instance_id: str
    total_tokens: int
    used_tokens: float  # KV usage fraction x total


class ContinueOrder(msgspec.Struct, frozen=True, gc=False):
    session_id: str
    instance_id: str
    force_pin: bool  # pin the session's next turn to instance_id once


class SessionDecision(msgspec.Struct, frozen=True, gc=False):
    hang: tuple[str, ...]
    resume: tuple[ContinueOrder, ...]
    remaining: dict[str, float]  # instance -> remaining capacity after this tick's hangs and continues


def schedule_sessions(
    instances: list[InstanceCapacity], sessions: list[SessionInfo], settings: ThunderAgent
) -> SessionDecision:
    live = [s for s in sessions if not s.is_closing and s.instance_id is not None]
    remaining: dict[str, float] = {}
    hang: list[str] = []
    for cap in instances:
        running = [s for s in live if s.instance_id == cap.instance_id and s.hang_state == "running"]
        hung_now, left = _hang_instance(cap, running, settings)
        hang.extend(hung_now)
        remaining[cap.instance_id] = left
    hung = _continue_order([s for s in live if s.hang_state == "hung"], settings)
    if settings.continue_scope == "bucketed":
        # a session hung on an instance that left the set (scaled down, lost) has no bucket: its pin moves,
        # best-fit over the room the buckets leave
        stranded = [s for s in hung if s.instance_id not in remaining]
        kept = [s for s in hung if s.instance_id in remaining]
        orders = _continue_bucketed(kept, remaining, settings) + _continue_global(stranded, remaining, settings)
    else:
        orders = _continue_global(hung, remaining, settings)
    if settings.ready_first and settings.max_ready_wait_s > 0:
        orders += _swap_for_ready(live, hung, orders, hang, remaining, settings)
    return SessionDecision(tuple(hang), tuple(orders), remaining)


def _size_key(session: SessionInfo) -> tuple[int, str]:
    return (session.total_tokens, session.session_id)


def _is_overdue(session: SessionInfo, settings: ThunderAgent) -> bool:
    return settings.max_hang_s > 0 and session.hung_for_s >= settings.max_hang_s


def _is_ready(session: SessionInfo, settings: ThunderAgent) -> bool:
    return settings.ready_first and session.waiting_s > 0


def _continue_order(hung: list[SessionInfo], settings: ThunderAgent) -> list[SessionInfo]:
    """Overdue sessions first, longest hung first; then ready turns, longest waiting first; then the rest
    smallest first."""
    overdue = sorted((s for s in hung if _is_overdue(s, settings)), key=lambda s: (-s.hung_for_s, s.session_id))
    rest = [s for s in hung if not _is_overdue(s, settings)]
    ready = sorted((s for s in rest if _is_ready(s, settings)), key=lambda s: (-s.waiting_s, s.session_id))
    return overdue + ready + sorted((s for s in rest if not _is_ready(s, settings)), key=_size_key)


def _demand(session: SessionInfo, settings: ThunderAgent) -> float:
    """The room a running session takes in the capacity view."""
    weight = 1.0 if session.status == "generate" else settings.env_weight
    return weight * session.total_tokens + settings.buffer_per_session


def _swap_for_ready(
    live: list[SessionInfo],
    hung: list[SessionInfo],
    orders: list[ContinueOrder],
    hang: list[str],
    remaining: dict[str, float],
    settings: ThunderAgent,
) -> list[ContinueOrder]:
    """Ready turns that waited ``max_ready_wait_s`` and that the room did not admit, each continued on its
    instance by hanging sessions there that are calling their environment (smallest first, only as many
    as make its room; none if they cannot): those need no KV until their tool answers, while the ready
    turn waits now. Appends to ``hang``."""
    continued, hung_now = {o.session_id for o in orders}, set(hang)
    swaps: list[ContinueOrder] = []
    for session in hung:
        instance = session.instance_id
        if not _is_ready(session, settings) or session.session_id in continued or instance not in remaining:
            continue
        if session.waiting_s < settings.max_ready_wait_s:
            continue
        short = session.total_tokens + settings.buffer_per_session - remaining[instance]
        at_env = sorted(
            (s for s in live if s.instance_id == instance and s.hang_state == "running" and s.status == "env"
             and s.session_id not in hung_now),
            key=_size_key,
        )  # fmt: skip
        freed, shed = 0.0, []
        for candidate in at_env:
            if freed >= short:
                break
            freed += _demand(candidate, settings)
            shed.append(candidate.session_id)
        if freed < short:
            continue
        hang.extend(shed)
        hung_now.update(shed)
        remaining[instance] += freed - session.total_tokens - settings.buffer_per_session
        swaps.append(ContinueOrder(session.session_id, instance, settings.continue_force_pin))
    return swaps


def _hang_instance(
    cap: InstanceCapacity, running: list[SessionInfo], settings: ThunderAgent
) -> tuple[list[str], float]:
    """Sessions to hang on one instance and its remaining capacity afterwards."""
    generating = sum(s.total_tokens for s in running if s.status == "generate")
    shared = max(0.0, generating - cap.used_tokens)
    remaining = cap.total_tokens + shared - sum(_demand(s, settings) for s in running)
    order = sorted((s for s in running if s.status == "env"), key=_size_key) + sorted(
        (s for s in running if s.status == "generate"), key=_size_key
    )
    hung: list[str] = []
    for session in order:
        if remaining >= 0:
            break
        hung.append(session.session_id)
        remaining += _demand(session, settings)
    return hung, remaining


def _continue_bucketed(
    hung: list[SessionInfo], remaining: dict[str, float], settings: ThunderAgent
) -> list[ContinueOrder]:
    buffer, orders = settings.buffer_per_session, []
    for instance_id, before in list(remaining.items()):
        if before <= buffer:
            continue
        left = before
        for session in (s for s in hung if s.instance_id == instance_id):
            need = session.total_tokens + buffer
            if need > left:
                if _is_overdue(session, settings):
                    break  # nothing passes an overdue session: the room is kept for it
                continue  # a smaller one may still fit
            left -= need
            orders.append(ContinueOrder(session.session_id, instance_id, settings.continue_force_pin))
        remaining[instance_id] = left
    return orders


def _continue_global(
    hung: list[SessionInfo], remaining: dict[str, float], settings: ThunderAgent
) -> list[ContinueOrder]:
    buffer = settings.buffer_per_session
    open_ids = [i for i, left in remaining.items() if left > buffer]
    budget = sum(remaining[i] for i in open_ids)
    chosen: list[SessionInfo] = []
    for session in hung:  # in continue order: as many as fit the total, overdue ones not passed
        if session.total_tokens + buffer > budget:
            if _is_overdue(session, settings):
                break
            continue
        budget -= session.total_tokens + buffer
        chosen.append(session)
    orders = []
    for session in sorted(chosen, key=_size_key, reverse=True):  # best-fit decreasing
        open_ids = sorted((i for i in open_ids if remaining[i] > buffer), key=lambda i: (-remaining[i], i))
        if not open_ids:
            break
        target = open_ids[0]
        need = session.total_tokens + buffer
        if need > remaining[target]:
            continue  # fragmented: try the smaller ones
        remaining[target] -= need
        orders.append(ContinueOrder(session.session_id, target, settings.continue_force_pin))
    return orders


class SessionTickLog(msgspec.Struct, frozen=True, gc=False):
    """One tick's inputs and decision, as recorded in ``session.tick`` for ``psrl replay --check sessions``."""

    instances: list[InstanceCapacity]
    sessions: list[SessionInfo]
    decision: SessionDecision


def encode_session_tick(log: SessionTickLog) -> bytes:
    return msgspec.msgpack.encode(log)


def decode_session_tick(record: bytes) -> SessionTickLog:
    return msgspec.msgpack.decode(record, type=SessionTickLog)
