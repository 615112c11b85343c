"""Chained block hashes: one hash per whole block that also stands for every block before it.

The engine's prefix cache, the offload tier, KV transfers and the router's view of the tiers all
name a block this way, so the same prefix has the same name on every instance.
"""

from __future__ import annotations

from collections.abc import Sequence

NO_HASH = -1


def chained_hash(parent: int, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block that also stands for every block before it (stable across processes:
    Python does not randomise the hashes of ints and tuples of ints)."""
    return hash((parent, token_ids))


def prefix_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[int]:
    """Chained hashes of the whole blocks of ``token_ids`` (at most ``max_blocks``)."""
    num_blocks = len(token_ids) // block_size
    if max_blocks is not None:
        num_blocks = min(num_blocks, max_blocks)
    hashes, parent = [], NO_HASH
    for index in range(num_blocks):
        parent = chained_hash(parent, tuple(token_ids[index * block_size : (index + 1) * block_size]))
        hashes.append(parent)
    return hashes


def reusable_blocks(num_tokens: int, block_size: int) -> int:
    """Whole blocks a request of ``num_tokens`` tokens can take from a cache: the last token is always
    recomputed, so the step that finishes its prefill has logits."""
    return max(0, (num_tokens - 1) // block_size)
