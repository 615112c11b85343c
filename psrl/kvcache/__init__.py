"""The KV offload tier (version-tagged blocks in CPU memory) and KV transfer between instances."""

from psrl.kvcache.index import TierChanges, TierIndex, TierKey
from psrl.kvcache.tier import KvTier, PayloadStore

__all__ = ["KvTier", "PayloadStore", "TierChanges", "TierIndex", "TierKey"]
