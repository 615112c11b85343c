"""What a KV fetch says on the wire (msgspec, never pickle).

The target asks the source's KV server for blocks by key, in prefix order; the source answers
with the keys it had (a prefix of those asked), their token ids and the bytes: in ZeroMQ frames
after the reply (channel ``tcp``), or written by NIXL straight into the buffer the target
registered (channel ``nixl``) before the reply is sent.
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
    dst_address: int = 0  # registered destination buffer of the target (nixl)
    dst_bytes: int = 0


class FetchReply(msgspec.Struct, array_like=True, frozen=True):
    transfer_id: str
    keys: list[tuple[int, int]]
    token_ids: list[list[int]]
    block_shape: list[int]
    dtype: str
    error: str = ""


ENCODER = msgspec.msgpack.Encoder()
REQUEST_DECODER = msgspec.msgpack.Decoder(FetchRequest)
REPLY_DECODER = msgspec.msgpack.Decoder(FetchReply)
