"""The record of one coordinator tick, as logged for replay (inputs and what was decided)."""

from __future__ import annotations

import msgspec

from psrl.coordination.state import CoordinationInputs
from psrl.coordination.tick import TickDecision


class TickLog(msgspec.Struct, frozen=True, gc=False):
    inputs: CoordinationInputs
    decision: TickDecision


def encode_tick(inputs: CoordinationInputs, decision: TickDecision) -> bytes:
    return msgspec.msgpack.encode(TickLog(inputs, decision))


def decode_tick(data: bytes) -> TickLog:
    return msgspec.msgpack.decode(data, type=TickLog)


def same_situation(a: CoordinationInputs, b: CoordinationInputs) -> bool:
    """True when two ticks saw the same facts (the clock aside): logging one of them is enough."""
    return msgspec.structs.replace(a, now=0.0) == msgspec.structs.replace(b, now=0.0)
