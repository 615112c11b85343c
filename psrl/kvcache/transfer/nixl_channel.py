"""KV blocks over NIXL (UCX): the target registers landing buffers, the source WRITEs into them.

DRAM to DRAM on this machine (3.3-3.9 GB/s measured unloaded); the same calls move GPU memory where
UCX supports it. Needs the optional ``nixl`` package (extra ``kv``).

What costs time is set-up, not bytes: a NIXL agent, a remote agent's metadata and its UCX
connection each take from a few hundred milliseconds to seconds on a loaded 2-core machine, a
memory registration tens of microseconds. So both sides keep what they set up: the target's
landing buffers are registered once, up front, and reused (a slot per fetch in flight), the
source connects to a target the first time it asks (even for nothing: that is how a fetcher warms
up) and keeps one registered staging buffer that the tier's blocks are copied into once. The
source waits for a WRITE by polling with a growing sleep, not a busy loop: on two shared cores a
spinning writer takes the CPU the transfer and the engine need.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from psrl.errors import MissingExtraError
from psrl.kvcache.transfer.wire import FetchRequest

DRAM = "DRAM"
WRITE_TIMEOUT_S = 30.0
POLL_SLEEP_MIN_S = 20e-6  # the first waits are short: a small WRITE is done in tens of microseconds
POLL_SLEEP_MAX_S = 1e-3


def make_agent(prefix: str) -> Any:
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:
        raise MissingExtraError("psrl.lmcache.p2p_transfer_channel=nixl", "kv", "nixl") from None
    return nixl_agent(f"{prefix}-{uuid.uuid4().hex[:12]}", nixl_agent_config(backends=["UCX"]))


@dataclass(slots=True)
class LandingSlot:
    """One registered region of the target's landing pool; held by one fetch at a time."""

    buffer: torch.Tensor
    handle: Any

    @property
    def address(self) -> int:
        return int(self.buffer.data_ptr())

    @property
    def size(self) -> int:
        return int(self.buffer.numel())


class NixlLanding:
    """The target's registered buffers that sources write blocks into: ``num_slots`` slots of
    ``slot_bytes``, all registered before the agent's metadata is first handed out, so a source
    that loaded it once can write into any of them (a later registration would need new metadata)."""

    def __init__(self, slot_bytes: int, num_slots: int) -> None:
        self.agent = make_agent("kv-target")
        self.slot_bytes = slot_bytes
        self._slots: list[LandingSlot] = []
        for _ in range(num_slots):
            buffer = torch.empty(slot_bytes, dtype=torch.uint8)
            self._slots.append(LandingSlot(buffer, self.agent.register_memory(buffer)))
        self._idle = list(self._slots)
        self._ready = threading.Condition()
        self.metadata = bytes(self.agent.get_agent_metadata())

    def acquire(self, nbytes: int, timeout_s: float) -> LandingSlot:
        """A free slot (waits up to ``timeout_s`` while every slot is in use)."""
        if nbytes > self.slot_bytes:
            raise ValueError(f"a landing slot holds {self.slot_bytes} bytes, the fetch needs {nbytes}")
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._idle), timeout_s):
                raise TimeoutError("no free NIXL landing slot")
            return self._idle.pop()

    def release(self, slot: LandingSlot) -> None:
        with self._ready:
            self._idle.append(slot)
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            slots, self._slots, self._idle = self._slots, [], []
        for slot in slots:
            self.agent.deregister_memory(slot.handle)


class NixlWriter:
    """The source's agent: connects to targets once and writes staged blocks into their slots."""

    def __init__(self, prefix: str) -> None:
        self.agent = make_agent(prefix)
        self.staging = torch.empty(0, dtype=torch.uint8)
        self._handle: Any = None
        self._peers: set[str] = set()
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
            self.staging = torch.empty(1 << max(0, nbytes - 1).bit_length(), dtype=torch.uint8)
            self._handle = self.agent.register_memory(self.staging)
        return self.staging[:nbytes]

    def write(self, payloads: list[torch.Tensor], request: FetchRequest) -> None:
        """Stage ``payloads`` back to back and write them into the target's slot."""
        nbytes = sum(p.numel() * p.element_size() for p in payloads)
        staging = self.stage(nbytes)
        offset = 0
        for payload in payloads:  # one contiguous region: one descriptor, one transfer
            size = payload.numel() * payload.element_size()
            staging[offset : offset + size].copy_(payload.contiguous().view(-1).view(torch.uint8))
            offset += size
        self.write_staged(nbytes, request)

    def write_staged(self, nbytes: int, request: FetchRequest) -> None:
        """Write the staging buffer's first ``nbytes`` into the target's slot and wait until done."""
        if nbytes > request.dst_bytes:
            raise ValueError(f"the target's buffer holds {request.dst_bytes} bytes, the blocks need {nbytes}")
        self.connect(request)
        local = self.agent.get_xfer_descs([(int(self.staging.data_ptr()), nbytes, 0)], DRAM)
        remote = self.agent.get_xfer_descs([(request.dst_address, nbytes, 0)], DRAM)
        handle = self.agent.initialize_xfer("WRITE", local, remote, request.nixl_agent)
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
