"""KV blocks over NIXL (UCX): the target registers landing buffers, the source WRITEs into them.

DRAM to DRAM on this machine (3.3-3.9 GB/s measured unloaded); the same calls move GPU memory where
UCX supports it. Needs the optional ``nixl`` package (extra ``kv``).

What costs time is set-up, not bytes: a NIXL agent, a remote agent's metadata and its UCX
connection each take from a few hundred milliseconds to seconds on a loaded 2-core machine, a
memory registration tens of microseconds. So both sides keep what they set up: the target
registers its tier's buffer once, up front, and sources write each block straight into an
allocation of it reserved for that block; the source registers its tier's buffer too and writes
from the blocks where they lie (lent by the tier until the write is done), or, for a store that
does not lend, from one registered staging buffer the blocks are copied into. The source connects
to a target the first time it asks (even for nothing: that is how a fetcher warms up). The
source waits for a WRITE by polling with a growing sleep, not a busy loop: on two shared cores a
spinning writer takes the CPU the transfer and the engine need.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from psrl.kvcache.host_buffer import huge_page_buffer
from psrl.kvcache.transfer.wire import FetchRequest
from psrl.nixl_agents import make_agent

DRAM = "DRAM"
FEATURE = "psrl.lmcache.p2p_transfer_channel=nixl"  # named when NIXL is not installed
WRITE_TIMEOUT_S = 30.0
POLL_SLEEP_MIN_S = 20e-6  # the first waits are short: a small WRITE is done in tens of microseconds
POLL_SLEEP_MAX_S = 2e-4  # a piece's write takes about a millisecond: a longer sleep would add half of it


class NixlLanding:
    """The target's memory that sources write blocks into: the tier's own buffer, so blocks land in
    place, in allocations reserved for them (psrl.kvcache.lmcache_store.Reservation). Registered
    once, before the agent's metadata is first handed out (a later registration would need new
    metadata at every source)."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        self.agent = make_agent("kv-target", FEATURE)
        self._handles = [self.agent.register_memory(buffer) for buffer in buffers]
        self._buffers = buffers  # registered memory must outlive its registration
        self.metadata = bytes(self.agent.get_agent_metadata())

    def close(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            self.agent.deregister_memory(handle)


class NixlWriter:
    """The source's agent: connects to targets once and writes blocks into the regions they reserved."""

    def __init__(self, prefix: str) -> None:
        self.agent = make_agent(prefix, FEATURE)
        self.staging = torch.empty(0, dtype=torch.uint8)
        self._handle: Any = None
        self._peers: set[str] = set()
        self._sources: dict[int, tuple[torch.Tensor, Any]] = {}
        self.num_polls = 0

    def connect(self, request: FetchRequest) -> None:
        """Load the target's metadata and open its connection, once per target agent."""
        if request.nixl_agent in self._peers:
            return
        self.agent.add_remote_agent(request.nixl_metadata)
        self.agent.make_connection(request.nixl_agent)
        self._peers.add(request.nixl_agent)

    def stage(self, nbytes: int) -> torch.Tensor:
        """The registered staging buffer's first ``nbytes`` (grown, and registered again, when short)."""
        if self.staging.numel() < nbytes:
            if self._handle is not None:
                self.agent.deregister_memory(self._handle)
            self.staging = huge_page_buffer(1 << max(0, nbytes - 1).bit_length())
            self._handle = self.agent.register_memory(self.staging)
        return self.staging[:nbytes]

    def register(self, buffer: torch.Tensor) -> None:
        """Register memory that blocks are written from as they lie (the tier's buffer), once."""
        if buffer.data_ptr() not in self._sources:
            self._sources[buffer.data_ptr()] = (buffer, self.agent.register_memory(buffer))

    def write_staged(self, nbytes: int, request: FetchRequest) -> None:
        """Write the staging buffer's first ``nbytes`` into the target's regions, in order."""
        self.write_regions([(int(self.staging.data_ptr()), nbytes)], request)

    def write_regions(self, local: list[tuple[int, int]], request: FetchRequest) -> None:
        """Write the bytes of ``local`` (address, length), back to back, into the target's regions
        (``request.dst_regions``, in order) and wait until done."""
        remote = [(int(address), int(size)) for address, size in request.dst_regions]
        pairs = match_regions(local, remote)
        self.connect(request)
        src = self.agent.get_xfer_descs([(a, n, 0) for a, _, n in pairs], DRAM)
        dst = self.agent.get_xfer_descs([(b, n, 0) for _, b, n in pairs], DRAM)
        handle = self.agent.initialize_xfer("WRITE", src, dst, request.nixl_agent)
        try:
            if self.agent.transfer(handle) == "ERR":
                raise RuntimeError(f"NIXL WRITE to {request.nixl_agent} failed to start")
            if self._wait(handle) == "ERR":
                raise RuntimeError(f"NIXL WRITE to {request.nixl_agent} failed")
        finally:
            self.agent.release_xfer_handle(handle)

    def _wait(self, handle: Any) -> str:
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        pause = 0.0
        while (state := self.agent.check_xfer_state(handle)) not in ("DONE", "ERR"):
            self.num_polls += 1
            if time.monotonic() > deadline:
                raise RuntimeError("NIXL WRITE did not finish")
            time.sleep(pause)  # the first pass only yields the GIL and the core
            pause = min(POLL_SLEEP_MAX_S, max(POLL_SLEEP_MIN_S, pause * 2))
        return str(state)

    def close(self) -> None:
        if self._handle is not None:
            self.agent.deregister_memory(self._handle)
            self._handle = None
        sources, self._sources = self._sources, {}
        for _buffer, handle in sources.values():
            self.agent.deregister_memory(handle)


def match_regions(local: list[tuple[int, int]], remote: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(local address, remote address, length) pieces that copy ``local`` back to back into
    ``remote`` back to back, as few as adjacency on both sides allows; the local bytes must fit."""
    pairs: list[tuple[int, int, int]] = []
    targets = iter(remote)
    dst, room = 0, 0
    for start, length in local:
        src, left = start, length
        while left:
            if room == 0:
                nxt = next(targets, None)
                if nxt is None:
                    raise ValueError("the target's regions hold fewer bytes than the blocks need")
                dst, room = nxt
                continue
            step = min(left, room)
            if pairs and pairs[-1][0] + pairs[-1][2] == src and pairs[-1][1] + pairs[-1][2] == dst:
                pairs[-1] = (pairs[-1][0], pairs[-1][1], pairs[-1][2] + step)  # adjacent on both sides: one
            else:
                pairs.append((src, dst, step))
            src, dst, left, room = src + step, dst + step, left - step, room - step
    return pairs
