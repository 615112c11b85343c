"""What a KV fetch says on the wire (msgspec, never pickle).

The target asks the source's KV server for blocks by key, in prefix order; the source answers
with the keys it had (a prefix of those asked), their token ids and the bytes: in one ZeroMQ frame
after the reply, the blocks back to back (channel ``tcp``), or written by NIXL straight into the
buffer the target registered (channel ``nixl``) before the reply is sent.

A target keeps its connection to a source for later fetches and asks for the next piece before the
current one has landed, so every request carries a number (``seq``) that its reply repeats: a reply
to a request the target gave up on (timed out, or asked ahead past a short piece) is told apart and
dropped.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Channel = Literal["nixl", "tcp"]


class FetchRequest(msgspec.Struct, array_like=True, frozen=True):
    transfer_id: str
    keys: list[tuple[int, int]]  # (weight version, chained block hash), prefix order
    channel: Channel
    release_pin: str = ""  # the source drops this pin owner once served (pin_sync)
    nixl_agent: str = ""
    nixl_metadata: bytes = b""
    dst_regions: list[tuple[int, int]] = []  # (address, bytes) the target registered, a block each (nixl)
    seq: int = 0  # repeated in the reply


class FetchReply(msgspec.Struct, array_like=True, frozen=True):
    transfer_id: str
    keys: list[tuple[int, int]]
    token_ids: list[list[int]]
    block_shape: list[int]
    dtype: str
    error: str = ""
    seq: int = 0


ENCODER = msgspec.msgpack.Encoder()
REQUEST_DECODER = msgspec.msgpack.Decoder(FetchRequest)
REPLY_DECODER = msgspec.msgpack.Decoder(FetchReply)
