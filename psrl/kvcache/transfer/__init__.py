"""KV transfer between instances: a source's server thread hands tier blocks to a target's fetcher."""

from psrl.kvcache.transfer.client import FetchOutcome, KvFetcher
from psrl.kvcache.transfer.server import KvServer

__all__ = ["FetchOutcome", "KvFetcher", "KvServer"]
