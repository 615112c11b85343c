"""The `psrl.*` tree: staleness, fine-grain overlap, coordination, KV offload, memory saver,
status collection, engine log-probs and the parameter server."""

from __future__ import annotations

from typing import Literal

from psrl.config.base import Section, field, section
from psrl.config.coordination import RolloutCoordination


class FineGrainOverlap(Section):
    granularity: Literal["none", "mini_batch", "micro_batch"] = field(
        "none", "Chunk unit released to the trainer before the whole buffer is ready (none = wait for it)."
    )
    multiplier: int = field(1, "Chunk = base unit x multiplier; clamped up to the next level when larger.", ge=1)
    overlap_scope: Literal["recompute", "pre_step"] = field(
        "recompute",
        "recompute: per-sample forwards per chunk, one update per buffer (exact); "
        "pre_step: advantage and an optimizer step per chunk.",
    )


class LMCache(Section):
    enable: bool = field(False, "Offload KV blocks to a CPU (or disk) tier for prefix reuse.")
    backend: Literal["cpu", "disk", "remote"] = field("cpu", "Offload tier.")
    offload_size_gb: float = field(100.0, "Offload budget in GiB, split over instances.", gt=0)
    chunk_size: int = field(256, "Tokens per offloaded chunk.", gt=0)
    multi_version_kv: bool = field(True, "Tag offloaded KV with the model version; never hit across versions.")
    clear_on_weight_update: bool = field(False, "Wipe the offload tier after every weight pull.")
    enable_p2p: bool = field(False, "Peer-to-peer KV transfer between instances on re-routing.")
    p2p_transfer_channel: Literal["nixl", "tcp"] = field("nixl", "Transport of P2P KV transfers.")
    cache_policy: Literal["LRU", "FIFO"] = field("LRU", "Eviction order of the offload tier.")
    store: Literal["lmcache", "host"] = field(
        "lmcache",
        "Where the tier's bytes live: LMCache's CPU backend (needs the kv extra), or psrl's own host buffer "
        "(no LMCache; the engine's own offload and reload only, no P2P KV transfer).",
    )
    disk_path: str | None = field(None, "Directory of the disk tier (required when backend=disk).")
    max_disk_size_gb: float = field(1000.0, "Disk tier cap in GiB.", gt=0)
    save_decode_cache: bool = field(True, "Also offload KV produced while decoding.")
    gpu_pin_block_budget: int = field(
        0, "Max offloaded blocks pinned at once for pin_sync transfers (0 = unlimited).", ge=0
    )


class TorchMemorySaver(Section):
    range: Literal["train", "rollout", "all"] | None = field(
        None,
        "Which side releases its GPU memory while idle under topology.colocate: train (trainer ranks), rollout "
        "(instances) or all (null = off); needs CUDA and the gpu extra (torch-memory-saver).",
    )
    enable_cuda_graph: bool = field(False, "Also release CUDA graphs (needs range=all).")
    enable_nixl: bool = field(
        False,
        "Keep NIXL buffers at stable addresses across pause/resume (refused: this version's NIXL buffers are "
        "in host memory).",
    )


class StatsRecorder(Section):
    enable: bool = field(True, "Write per-instance status snapshots to the run directory.")
    interval_in_s: float = field(1.0, "Snapshot period in seconds.", gt=0)


class StatusCollection(Section):
    enable: bool = field(
        True, "Instances publish status snapshots; needed by request_num_balance, status_based sync, migration."
    )
    engine_sync_interval_in_ms: int = field(100, "Period of instance status snapshots.", gt=0)
    stats_recorder: StatsRecorder = section(StatsRecorder, "Status snapshots on disk.")


class LogProb(Section):
    enable_rollout_engine_log_prob: bool = field(
        True, "The rollout engine returns each sampled token's log-probability (needed for token-level IS)."
    )


class ParameterServer(Section):
    transport: Literal["auto", "zmq", "shm", "nixl", "torch_dist"] = field(
        "auto",
        "Bulk weight transport: ZeroMQ zero-copy frames, shared memory (shards, trainer and instances on one "
        "host; a pull is a mapped read), NIXL (kv extra) or torch.distributed broadcast. auto: shm when the run "
        "is on one host and /dev/shm (or PSRL_SHM_DIR) has room for four versions of the model, else zmq; the "
        "launcher logs its choice and writes it to the run's config.",
    )
    delta_sync: bool = field(
        False, "Pull only entries whose checksum changed since the instance's version (keeps a host mirror)."
    )
    chunk_mb: int = field(
        0,
        "Largest entry of a weight transfer in MiB; bigger tensors are split into blocks. 0 = auto: 512 on "
        "shared memory (a whole tensor is loaded straight from the shard's mapping, a block is copied first), "
        "16 on the other transports.",
        ge=0,
    )
    checksum: bool = field(True, "Checksum every entry (xxh3) and verify it on every shard and puller.")
    serve_dtype: Literal["train", "engine"] = field(
        "engine", "Dtype shards serve: the trainer's as pushed, or engine.dtype (cast once per version at the shard)."
    )
    snapshot: bool = field(
        True,
        "Each shard keeps its committed version in a file under the run directory (ps/, written as entries "
        "land), so a restarted shard serves it again at once; off: it waits for the trainer's next push.",
    )
    push_timeout_s: float = field(300.0, "A push (including refills of restarted shards) fails after this long.", gt=0)
    pull_timeout_s: float = field(60.0, "A pull fails after this long without progress.", gt=0)
    probe_interval_s: float = field(1.0, "A shard silent this long during a push gets a status probe.", gt=0)
    pull_attempts: int = field(5, "Pull attempts of one weight sync before the instance reports failure.", ge=1)
    prefetch: bool = field(
        True,
        "Instances pull a newly published version in the background while they generate, so a sync only "
        "loads it (full pulls only: with delta_sync an instance pulls at sync time).",
    )
    prefetch_to_device: bool | Literal["auto"] = field(
        "auto",
        "A prefetched version is also copied onto the instance's GPU in the background, so a sync's load is a "
        "device-to-device copy (psrl.ps.landing). auto: with the embedded engine on CUDA outside colocation, when "
        "the version fits in a tenth of the GPU's free memory (else it loads from host memory as before).",
    )


class AgenticRL(Section):
    manager_retry_on_error: bool = field(
        True, "When every attempt of a group fails, dispatch a replacement prompt instead of stopping the run."
    )
    retry_limit: int = field(1, "Retries of a failed rollout request before its group counts as failed.", ge=0)


class PsrlSection(Section):
    staleness: int = field(0, "Maximum version gap between a consumed trajectory and the trainer (0 = synchronous).")
    staleness_buffer_entries: int = field(512, "Prompt groups per staleness buffer (= one training batch).", ge=1)
    rollout_n: int = field(1, "Responses per prompt (group size).", ge=1)
    max_dispatch_ahead: int = field(
        5, "Caps how many buffers of work are dispatched ahead: min(staleness, this).", ge=0
    )
    fine_grain_overlap: FineGrainOverlap = section(FineGrainOverlap, "Train on chunks of a buffer as they arrive.")
    rollout_coordination: RolloutCoordination = section(RolloutCoordination, "Rollout coordination techniques.")
    lmcache: LMCache = section(LMCache, "KV offload tier with version tags.")
    tms: TorchMemorySaver = section(TorchMemorySaver, "GPU memory release while idle.")
    status_collection: StatusCollection = section(StatusCollection, "Instance status snapshots.")
    log_prob: LogProb = section(LogProb, "Engine log-probabilities.")
    ps: ParameterServer = section(ParameterServer, "Parameter-server transport and sync options.")
    agentic_rl: AgenticRL = section(AgenticRL, "Failure handling of rollout requests.")
