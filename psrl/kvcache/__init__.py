"""The KV offload tier (version-tagged blocks in CPU memory) and KV transfer between instances.

Import from the submodules (``psrl.kvcache.tier``, ``psrl.kvcache.index``, ``psrl.kvcache.keys``):
the router reads block keys and tier reports without torch, which the tier itself needs.
"""
