"""Parameter server: sharded, double-buffered weight versions and their transfer.

Trainer side: ``Pusher.push(version, tensors)``. Rollout side: ``Puller.pull(version, load)`` or
``Puller.stream(version)``. A shard is a ``ShardServer`` that an actor hosts. See each module's
docstring for the protocol; ``psrl.ps.local`` runs shards as local processes.
"""

from psrl.ps.errors import PullFailedError, PushFailedError, PushRefusedError
from psrl.ps.protocol import LATEST
from psrl.ps.pull_stream import PullResult, PullStream
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher, PushResult
from psrl.ps.shard import ShardOptions, ShardServer, VersionEvent

__all__ = [
    "LATEST",
    "PullFailedError",
    "PullResult",
    "PullStream",
    "Puller",
    "PushFailedError",
    "PushRefusedError",
    "PushResult",
    "Pusher",
    "ShardOptions",
    "ShardServer",
    "VersionEvent",
]
