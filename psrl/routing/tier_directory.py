"""The router's picture of every instance's offload tier, built from incremental ``KvTierReport``s.

``match`` answers cache_aware_v1's question (psrl.routing.offload): per instance, how many leading
tokens of a request its tier could serve. Only entries of the version the instance runs count:
an instance never loads an entry computed under other weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from psrl.kvcache.keys import prefix_hashes, reusable_blocks


class TierDirectory:
    def __init__(self, block_size: int, version_of: Callable[[str], int | None]) -> None:
        self.block_size = block_size
        self.version_of = version_of
        self.addresses: dict[str, str] = {}
        self._keys: dict[str, set[tuple[int, int]]] = {}
        self._last_seq: dict[str, int] = {}
        self.num_gaps = 0

    def apply(
        self,
        instance: str,
        address: str,
        added: Iterable[Sequence[int]],
        removed: Iterable[Sequence[int]],
        cleared: bool,
        report_seq: int,
    ) -> None:
        keys = self._keys.setdefault(instance, set())
        last = self._last_seq.get(instance)
        if last is not None and report_seq != last + 1:
            # a lost report: what it removed would linger and be scored. Forget the instance's keys
            # instead; its next snapshot (psrl.flows.instance_kv) restores them.
            self.num_gaps += 1
            cleared = True
        self._last_seq[instance] = report_seq
        if address:
            self.addresses[instance] = address
        if cleared:
            keys.clear()
        keys.difference_update((int(v), int(h)) for v, h in removed)
        keys.update((int(v), int(h)) for v, h in added)

    def remove(self, instance: str) -> None:
        self._keys.pop(instance, None)
        self._last_seq.pop(instance, None)
        self.addresses.pop(instance, None)

    def blocks(self, instance: str) -> set[tuple[int, int]]:
        """The (version, hash) keys the router believes ``instance``'s tier holds."""
        return set(self._keys.get(instance, ()))

    def num_blocks(self, instance: str) -> int:
        return len(self._keys.get(instance, ()))

    def match(self, token_ids: Sequence[int]) -> Mapping[str, int]:
        size = self.block_size
        hashes = prefix_hashes(token_ids, size, reusable_blocks(len(token_ids), size))
        matches: dict[str, int] = {}
        for instance, keys in self._keys.items():
            version = self.version_of(instance)
            if version is None or not keys:
                continue
            count = 0
            for block_hash in hashes:
                if (version, block_hash) not in keys:
                    break
                count += 1
            if count:
                matches[instance] = count * size
        return matches
