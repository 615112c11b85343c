"""KV blocks over NIXL (UCX): the target registers a landing buffer, the source WRITEs into it.

DRAM to DRAM on this machine (3.3-3.9 GB/s measured); the same calls move GPU memory where UCX
supports it. Needs the optional ``nixl`` package (extra ``kv``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import torch

from psrl.errors import MissingExtraError
from psrl.kvcache.transfer.wire import FetchRequest

DRAM = "DRAM"
WRITE_TIMEOUT_S = 30.0


def make_agent(prefix: str) -> Any:
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:
        raise MissingExtraError("psrl.lmcache.p2p_transfer_channel=nixl", "kv", "nixl") from None
    return nixl_agent(f"{prefix}-{uuid.uuid4().hex[:12]}", nixl_agent_config(backends=["UCX"]))


class NixlLanding:
    """The target's registered buffer that a source writes blocks into (grown on demand)."""

    def __init__(self) -> None:
        self.agent = make_agent("kv-target")
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self._handle: Any = None

    def reserve(self, nbytes: int) -> tuple[int, int]:
        """(address, size) of a registered region of at least ``nbytes``."""
        if self.buffer.numel() < nbytes:
            if self._handle is not None:
                self.agent.deregister_memory(self._handle)
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
            self._handle = self.agent.register_memory(self.buffer)
        return int(self.buffer.data_ptr()), int(self.buffer.numel())

    @property
    def metadata(self) -> bytes:
        return bytes(self.agent.get_agent_metadata())

    def close(self) -> None:
        if self._handle is not None:
            self.agent.deregister_memory(self._handle)
            self._handle = None


class NixlWriter:
    """The source's agent: writes gathered blocks into a target's landing buffer."""

    def __init__(self, prefix: str) -> None:
        self.agent = make_agent(prefix)
        self.staging = torch.empty(0, dtype=torch.uint8)
        self._handle: Any = None
        self._peers: set[str] = set()

    def write(self, payloads: list[torch.Tensor], request: FetchRequest) -> None:
        nbytes = sum(p.numel() * p.element_size() for p in payloads)
        if nbytes > request.dst_bytes:
            raise ValueError(f"the target's buffer holds {request.dst_bytes} bytes, the blocks need {nbytes}")
        staging = self._stage(nbytes)
        offset = 0
        for payload in payloads:  # one contiguous region: one descriptor, one transfer
            size = payload.numel() * payload.element_size()
            staging[offset : offset + size].copy_(payload.contiguous().view(-1).view(torch.uint8))
            offset += size
        if request.nixl_agent not in self._peers:
            self.agent.add_remote_agent(request.nixl_metadata)
            self._peers.add(request.nixl_agent)
        local = self.agent.get_xfer_descs([(int(staging.data_ptr()), nbytes, 0)], DRAM)
        remote = self.agent.get_xfer_descs([(request.dst_address, nbytes, 0)], DRAM)
        handle = self.agent.initialize_xfer("WRITE", local, remote, request.nixl_agent)
        try:
            if self.agent.transfer(handle) == "ERR":
                raise RuntimeError(f"NIXL WRITE to {request.nixl_agent} failed to start")
            deadline = time.monotonic() + WRITE_TIMEOUT_S
            while (state := self.agent.check_xfer_state(handle)) not in ("DONE", "ERR"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"NIXL WRITE to {request.nixl_agent} did not finish")
            if state == "ERR":
                raise RuntimeError(f"NIXL WRITE to {request.nixl_agent} failed")
        finally:
            self.agent.release_xfer_handle(handle)

    def _stage(self, nbytes: int) -> torch.Tensor:
        if self.staging.numel() < nbytes:
            if self._handle is not None:
                self.agent.deregister_memory(self._handle)
            self.staging = torch.empty(nbytes, dtype=torch.uint8)
            self._handle = self.agent.register_memory(self.staging)
        return self.staging

    def close(self) -> None:
        if self._handle is not None:
            self.agent.deregister_memory(self._handle)
            self._handle = None
