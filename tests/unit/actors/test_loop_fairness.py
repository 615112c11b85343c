"""An actor's loop under inputs that never run dry: it still reaches its work and timers, and a link
reads what is queued before a long handler holds the actor."""

from __future__ import annotations

import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import zmq

from actors.base import Actor
from actors.flow_actor import LINK_BURST, FlowActor


def _bare(cls: type[Any]) -> Any:
    actor = object.__new__(cls)  # the loop's input path only: no boot, no bus
    actor.stop_reason = None
    return actor


def test_inputs_that_never_run_dry_leave_the_loop_its_turn() -> None:
    ctx = zmq.Context()
    receiver, sender = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    receiver.bind("inproc://flood")
    sender.connect("inproc://flood")
    for _ in range(500):
        sender.send(b"x")
    handled = []

    def slow_handler() -> None:  # each message takes a millisecond: 500 of them outlast the budget
        receiver.recv()
        handled.append(1)
        time.sleep(0.001)

    actor = _bare(Actor)
    actor._poller = zmq.Poller()
    actor._poller.register(receiver, zmq.POLLIN)
    actor._inputs = {receiver: slow_handler}
    actor._control_inputs = set()
    actor._drain_inputs(0)
    assert 0 < len(handled) < 500 and receiver.poll(0)  # returned with input still waiting
    for sock in (receiver, sender):
        sock.close(0)
    ctx.term()


class _QueuedLink:
    """Test edge: a link's receive side holding ``count`` queued messages."""

    def __init__(self, count: int) -> None:
        self.queue = deque(range(count))

    def recv(self) -> tuple[str, list[Any]] | None:
        return ("peer", [SimpleNamespace(n=self.queue.popleft())]) if self.queue else None


def test_a_link_reads_a_burst_before_its_first_handler_runs() -> None:
    link = _QueuedLink(LINK_BURST + 10)
    actor = _bare(FlowActor)
    waiting_at_dispatch: list[int] = []
    actor.dispatch = lambda event: waiting_at_dispatch.append(len(link.queue))
    actor._on_link(link)
    assert len(waiting_at_dispatch) == LINK_BURST  # a bounded burst: the rest waits for the next turn
    assert set(waiting_at_dispatch) == {10}  # every message of the burst was read before any was handled
