"""An instance's tier reports as the router sees them: changes only, snapshots, and lost reports."""

from __future__ import annotations

import torch

from psrl.config.coordination import KvTransfer
from psrl.flows.instance_kv import SNAPSHOT_EVERY_TICKS, InstanceKv, KvPort
from psrl.kvcache.index import TierKey
from psrl.kvcache.tier import KvTier
from psrl.routing.tier_directory import TierDirectory


class DictStore:
    """The tier's bytes in a dict (LMCache's store needs the kv extra; the bookkeeping is the same)."""

    def __init__(self) -> None:
        self.data: dict[TierKey, torch.Tensor] = {}

    def put(self, key: TierKey, kv: torch.Tensor) -> None:
        self.data[key] = kv.clone()

    def put_many(self, keys: list[TierKey], kvs: torch.Tensor) -> None:
        for key, kv in zip(keys, kvs, strict=True):
            self.put(key, kv)

    def read_many_into(self, keys: list[TierKey], out: torch.Tensor) -> int:
        for count, key in enumerate(keys):
            if key not in self.data:
                return count
            out[count].copy_(self.data[key].view(out[count].shape))
        return len(keys)

    def get(self, key: TierKey) -> torch.Tensor | None:
        return self.data.get(key)

    def contains(self, key: TierKey) -> bool:
        return key in self.data

    def delete(self, key: TierKey) -> None:
        self.data.pop(key, None)

    def clear(self) -> None:
        self.data.clear()


def feed(directory: TierDirectory, kv: InstanceKv) -> bool:
    report = kv.report()
    if report is not None:
        directory.apply("i0", report.address, report.added.tolist(), report.removed.tolist(), report.cleared,
                        report.report_seq)  # fmt: skip
    return report is not None


def test_reports_carry_changes_then_a_periodic_snapshot_heals_a_lost_report() -> None:
    tier = KvTier(DictStore(), 4 * 64)  # four blocks of 64 bytes
    kv = InstanceKv("i0", KvPort(tier), KvTransfer(), engine=None)
    directory = TierDirectory(4, lambda _: 0)
    block = torch.zeros(16)
    assert feed(directory, kv)  # the first report always goes (it carries the address)
    for h in range(3):
        tier.put((0, h), (h,), block)
    assert feed(directory, kv) and directory.blocks("i0") == {(0, 0), (0, 1), (0, 2)}
    assert not feed(directory, kv)  # nothing changed: nothing sent
    for h in range(3, 6):  # evicts 0 and 1; this report is lost on its way
        tier.put((0, h), (h,), block)
    assert kv.report() is not None
    tier.put((0, 6), (6,), block)  # evicts 2
    feed(directory, kv)  # the gap: the router forgets rather than score 0, 1 or 2
    assert directory.num_gaps == 1 and directory.blocks("i0") == {(0, 6)}
    while kv.num_ticks % SNAPSHOT_EVERY_TICKS != SNAPSHOT_EVERY_TICKS - 1:
        assert not feed(directory, kv)
    assert feed(directory, kv)
    assert directory.blocks("i0") == set(tier.keys()) == {(0, 3), (0, 4), (0, 5), (0, 6)}
