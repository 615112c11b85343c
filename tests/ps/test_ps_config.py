"""psrl.ps.* settings reach shards, pushers and pullers."""

from __future__ import annotations

import pytest
import torch

from psrl.config import load_config
from psrl.errors import ConfigError
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


@pytest.mark.parametrize(("transport", "block_mib"), [("shm", 512), ("zmq", 16), ("torch_dist", 16)])
def test_automatic_block_size_suits_the_transport(sockdir: str, transport: str, block_mib: int) -> None:
    config = load_config("demo", [f"psrl.ps.transport={transport}"])
    assert config.psrl.ps.chunk_mb == 0  # auto is the default
    pusher = make_pusher(config, [f"ipc://{sockdir}/p{i}" for i in range(2)], incarnation=1)
    assert pusher.max_block_bytes == block_mib << 20
    pusher.close()


def test_a_negative_block_size_is_refused_with_the_field() -> None:
    with pytest.raises(ConfigError, match="chunk_mb"):
        load_config("demo", ["psrl.ps.chunk_mb=-1"])
