"""When a re-routed request fetches its KV, and how: the instance's side of KV transfer.

The fetcher is replaced by one that records what it was asked (the wire is tested in
test_transfer_pieces.py); the tier and the flow's decisions are real.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from bus.messages import GenerateRequest, RequestSampling
from psrl.config.coordination import KvTransfer
from psrl.flows.instance_kv import InstanceKv, KvPort
from psrl.kvcache.tier import KvTier
from tests.unit.kvcache.test_tier_reports import DictStore


class RecordingFetcher:
    def __init__(self) -> None:
        self.started: list[dict[str, Any]] = []

    def start(self, transfer_id: str, address: str, keys: list[tuple[int, int]], timeout_s: float,
              release_pin: str = "", awaited: bool = False) -> Future[Any]:  # fmt: skip
        self.started.append({"keys": keys, "pin": release_pin, "awaited": awaited})
        return Future()


class Engine:
    """The engine's one answer the flow needs here: the tier keys of a prefix's whole blocks."""

    def prefix_keys(self, token_ids: list[int]) -> list[tuple[int, int]]:
        return [(0, block) for block in range((len(token_ids) - 1) // 16)]


def rerouted(num_tokens: int) -> GenerateRequest:
    tokens = np.arange(num_tokens, dtype=np.int32)
    return GenerateRequest(request_id=7, prompt_id=3, prompt_token_ids=tokens, sampling=RequestSampling(max_tokens=8),
                           kv_source="i1", kv_source_address="tcp://127.0.0.1:1")  # fmt: skip


def instance(mode: str) -> tuple[InstanceKv, RecordingFetcher]:
    fetcher = RecordingFetcher()
    port = KvPort(KvTier(DictStore(), 1 << 20), fetcher=fetcher)  # type: ignore[arg-type]
    return InstanceKv("i0", port, KvTransfer(enable=True, transfer_mode=mode), Engine()), fetcher  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["async", "sync", "pin_sync"])
def test_no_whole_block_to_reuse_fetches_nothing_and_waits_for_nothing(mode: str) -> None:
    kv, fetcher = instance(mode)
    request = rerouted(12)
    assert kv.wants_fetch(request)
    assert kv.start_fetch(request, list(range(12)), now=0.0) is False
    assert fetcher.started == [] and kv.awaiting == {}


@pytest.mark.parametrize(("mode", "waits"), [("async", False), ("sync", True), ("pin_sync", True)])
def test_a_fetch_the_request_waits_for_asks_for_its_blocks_as_a_whole(mode: str, waits: bool) -> None:
    kv, fetcher = instance(mode)
    assert kv.start_fetch(rerouted(40), list(range(40)), now=0.0) is waits
    (started,) = fetcher.started
    assert started["keys"] == [(0, 0), (0, 1)] and started["awaited"] is waits
    assert started["pin"] == ("7" if mode == "pin_sync" else "")
