"""psrl.ps.* settings reach shards, pushers and pullers."""

from __future__ import annotations

import torch

from psrl.config import load_config
from psrl.ps.from_config import make_puller, make_pusher, shard_options


def test_settings_flow_into_the_parts(sockdir: str) -> None:
    config = load_config(
        "demo",
        ["psrl.ps.transport=torch_dist", "psrl.ps.chunk_mb=4", "psrl.ps.delta_sync=true", "topology.n_ps_shards=3"],
    )
    options = shard_options(config, 2, f"ipc://{sockdir}/a", f"ipc://{sockdir}/b", torch.bfloat16)
    assert (options.num_shards, options.transport, options.serve_dtype) == (3, "torch_dist", "bfloat16")
    pusher = make_pusher(config, [f"ipc://{sockdir}/p{i}" for i in range(3)], incarnation=4)
    puller = make_puller(config, [f"ipc://{sockdir}/q{i}" for i in range(3)])
    assert pusher.max_block_bytes == 4 << 20 and pusher.incarnation == 4 and pusher.with_checksums
    assert puller.delta_sync and puller.mirror is not None
    pusher.close()
    puller.close()


def test_train_dtype_is_served_as_pushed(sockdir: str) -> None:
    config = load_config("demo", ["psrl.ps.serve_dtype=train"])
    options = shard_options(config, 0, f"ipc://{sockdir}/a", f"ipc://{sockdir}/b", torch.bfloat16)
    assert options.serve_dtype is None
