"""psrl.ps.* settings reach shards, pushers and pullers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from psrl.config import load_config
from psrl.errors import ConfigError
from psrl.ps.from_config import make_puller, make_pusher, resolve_transport, served_version_bytes, shard_options
from psrl.ps.transport_choice import SHM_VERSIONS_HELD, choose_transport


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
    config = load_config("demo", ["psrl.ps.serve_dtype=train", "psrl.ps.transport=zmq"])
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


def test_auto_takes_shared_memory_on_one_host_with_room_and_zeromq_otherwise() -> None:
    version = 10**9
    room = SHM_VERSIONS_HELD * version
    assert choose_transport("auto", spans_hosts=False, shm_free_bytes=room, version_bytes=version).name == "shm"
    spanning = choose_transport("auto", spans_hosts=True, shm_free_bytes=room, version_bytes=version)
    assert spanning.name == "zmq" and "spans hosts" in spanning.reason
    short = choose_transport("auto", spans_hosts=False, shm_free_bytes=room - 1, version_bytes=version)
    assert short.name == "zmq" and "--shm-size" in short.reason
    assert choose_transport("nixl", spans_hosts=True, shm_free_bytes=0, version_bytes=version).name == "nixl"


def test_a_version_is_counted_from_the_checkpoint_headers_at_the_width_served(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(3, 5), "b": torch.zeros(7, dtype=torch.bfloat16)}, str(tmp_path / "one.safetensors"))
    save_file({"c": torch.zeros(2, 2, 2)}, str(tmp_path / "two.safetensors"))
    path = f"model.path={tmp_path}"
    assert served_version_bytes(load_config("demo", [path, "engine.dtype=bfloat16"])) == 30 * 2
    assert served_version_bytes(load_config("demo", [path, "engine.dtype=float32"])) == 30 * 4
    assert (
        served_version_bytes(load_config("demo", [path, "engine.dtype=bfloat16", "psrl.ps.serve_dtype=train"])) == 120
    )


def test_the_launcher_resolves_auto_and_parts_refuse_an_unresolved_one(
    sockdir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config("demo")
    assert config.psrl.ps.transport == "auto"
    with pytest.raises(ValueError, match=r"psrl\.ps\.transport=auto"):
        make_pusher(config, [f"ipc://{sockdir}/p0"], incarnation=1)
    spanning, choice = resolve_transport(config, spans_hosts=True)
    assert spanning.psrl.ps.transport == "zmq" and choice.reason == "the run spans hosts"
    monkeypatch.setenv("PSRL_SHM_DIR", str(tmp_path))  # a disk directory with room for the demo model's versions
    local, choice = resolve_transport(config, spans_hosts=False)
    assert (local.psrl.ps.transport, choice.name) == ("shm", "shm")
    assert local.psrl.ps.model_dump() == {**config.psrl.ps.model_dump(), "transport": "shm"}
    explicit, choice = resolve_transport(load_config("demo", ["psrl.ps.transport=zmq"]), spans_hosts=False)
    assert explicit.psrl.ps.transport == "zmq" and choice.reason == "set"
