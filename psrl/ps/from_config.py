"""Build shards, pushers and pullers from the run configuration (``psrl.ps.*``).

Endpoints come from whoever places the actors (the launcher); the rollout engine's dtype from the
engine (``EngineArgs.resolve_dtype``), so this module decides nothing about devices. ``curve``: the
run's CURVE keys when it spans hosts (the hosting actor's), so weight traffic is authenticated too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from bus.security import CurveKeys
from psrl.config import Config
from psrl.cpu_usage import nvidia_gpu_present
from psrl.ps.dtypes import dtype_name
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher
from psrl.ps.shard import ShardOptions
from psrl.ps.transport_choice import TransportChoice, choose_transport
from psrl.ps.transports.shm import shm_directory

MIB = 1 << 20
AUTO_BLOCK_MIB = 16  # frames that pipeline over sockets
AUTO_SHM_BLOCK_MIB = 512  # few tensors split: whole ones are read from the mapping, blocks are copied


def shard_options(
    config: Config,
    shard: int,
    push_endpoint: str,
    pull_endpoint: str,
    engine_dtype: torch.dtype,
    curve: CurveKeys | None = None,
    run_dir: str | None = None,
) -> ShardOptions:
    """``run_dir``: where the shard keeps its snapshot (``psrl.ps.snapshot``); None keeps none."""
    ps = config.psrl.ps
    return ShardOptions(
        shard=shard,
        num_shards=config.topology.n_ps_shards,
        push_endpoint=push_endpoint,
        pull_endpoint=pull_endpoint,
        transport=transport_of(config),
        serve_dtype=dtype_name(engine_dtype) if ps.serve_dtype == "engine" else None,
        host=config.bus.host,
        curve=curve,
        snapshot_dir=str(Path(run_dir) / "ps") if ps.snapshot and run_dir is not None else None,
        max_frame_bytes=max(block_mib(transport_of(config), ps.chunk_mb), config.bus.max_message_mib) * MIB,
    )


def transport_of(config: Config) -> str:
    """The run's weight transport; ``auto`` must have been resolved by whoever placed the actors."""
    transport = config.psrl.ps.transport
    if transport == "auto":
        raise ValueError(
            "psrl.ps.transport=auto is chosen where the actors are placed (the launcher: resolve_transport); "
            "set psrl.ps.transport=zmq or shm when building parameter-server parts directly"
        )
    return transport


def block_mib(transport: str, chunk_mb: int = 0) -> int:
    """``psrl.ps.chunk_mb``, or for 0 the size that suits ``transport``: on shared memory a 7B sync
    took 1.83 s with 512 MiB blocks and 2.21 s with 64 MiB (an H200 host; docs/benchmarks.md)."""
    if chunk_mb > 0:
        return chunk_mb
    return AUTO_SHM_BLOCK_MIB if transport == "shm" else AUTO_BLOCK_MIB


def staging_dtype(config: Config, engine_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype a trainer casts floating weights to before they leave its device: the one shards
    would serve anyway (``psrl.ps.serve_dtype=engine``), so half the bytes move for a bf16 engine."""
    return engine_dtype if config.psrl.ps.serve_dtype == "engine" else None


def make_pusher(
    config: Config, push_endpoints: Sequence[str], incarnation: int, curve: CurveKeys | None = None
) -> Pusher:
    ps = config.psrl.ps
    return Pusher(
        push_endpoints,
        incarnation,
        transport=transport_of(config),
        max_block_bytes=block_mib(transport_of(config), ps.chunk_mb) * MIB,
        with_checksums=ps.checksum,
        timeout_s=ps.push_timeout_s,
        probe_interval_s=ps.probe_interval_s,
        host=config.bus.host,
        curve=curve,
    )


def make_puller(
    config: Config, pull_endpoints: Sequence[str], curve: CurveKeys | None = None, pin_memory: bool = False
) -> Puller:
    """``pin_memory``: the instance's engine is on a GPU (mapped weights are pinned for its copies)."""
    ps = config.psrl.ps
    return Puller(
        pull_endpoints,
        transport=transport_of(config),
        delta_sync=ps.delta_sync,
        verify=ps.checksum,
        timeout_s=ps.pull_timeout_s,
        host=config.bus.host,
        curve=curve,
        pin_memory=pin_memory,
    )


def resolve_transport(config: Config, *, spans_hosts: bool) -> tuple[Config, TransportChoice]:
    """``config`` with ``psrl.ps.transport=auto`` replaced by the transport chosen for this host
    (``psrl.ps.transport_choice``); other settings come back as they are."""
    ps = config.psrl.ps
    if ps.transport != "auto":
        return config, TransportChoice(ps.transport, "set")
    free = 0
    if not spans_hosts:
        stat = os.statvfs(shm_directory())
        free = stat.f_bavail * stat.f_frsize
    choice = choose_transport("auto", spans_hosts=spans_hosts, shm_free_bytes=free,
                              version_bytes=served_version_bytes(config))  # fmt: skip
    resolved = config.model_copy(update={"psrl": config.psrl.model_copy(
        update={"ps": ps.model_copy(update={"transport": choice.name})})})  # fmt: skip
    return resolved, choice


def served_version_bytes(config: Config) -> int:
    """Bytes of one version as the shards serve it: the checkpoint's elements (from its safetensors headers)
    at the engine's width (psrl.ps.serve_dtype=engine) or at four bytes (as the trainer pushes them)."""
    from psrl.assets import DEMO_MODEL_DIR

    numel = sum(_safetensors_numel(path) for path in Path(config.model.path or DEMO_MODEL_DIR).glob("*.safetensors"))
    return numel * (2 if config.psrl.ps.serve_dtype == "engine" and _engine_is_16_bit(config) else 4)


def _engine_is_16_bit(config: Config) -> bool:
    dtype = config.engine.dtype
    if dtype != "auto":
        return dtype == "bfloat16"
    device = config.topology.device
    return device == "cuda" or (device == "auto" and nvidia_gpu_present())  # no CUDA in the launcher


def _safetensors_numel(path: Path) -> int:
    """Elements in a safetensors file, from its JSON header alone (8-byte little-endian length, then JSON)."""
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
