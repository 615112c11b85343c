"""The project's own sections: model, task, topology, engine, bus and run directory."""

from __future__ import annotations

from typing import Any, Literal

from psrl.config.base import Section, Switch, field


class Model(Section):
    path: str | None = field(
        None, "Hugging Face checkpoint directory (config.json + safetensors); unset = the shipped demo model."
    )
    tokenizer_path: str | None = field(None, "Tokenizer directory; unset = the model directory.")


class TaskSettings(Section):
    name: str = field(
        "demo",
        "Task module: prompt generator and reward function (see psrl.tasks); reasoning_gym:<dataset>; "
        "verifiers:<env id | module:function | file.py:function> (needs the verifiers extra).",
    )
    seed: int = field(0, "Seed of the prompt generator.")
    kwargs: dict[str, Any] = field(
        {},
        "reasoning_gym:<dataset> tasks: the dataset's config (the fields of its config class) and size, the number "
        "of distinct training problems; reasoning_gym:composite takes datasets=[{name, weight, config}]. "
        "verifiers:<env> tasks: the keyword arguments of the environment's loader.",
    )
    answer_tag: str | None = field(
        "answer",
        "reasoning_gym tasks: the answer scored is the text inside <answer_tag>...</answer_tag> of the response "
        "(the library's default system prompt asks for it); null = the whole response, with no system prompt "
        "unless data.system_prompt is set.",
    )
    response_prefix: str = field(
        "",
        "reasoning_gym tasks: text put after the chat template's generation prompt, which the model continues "
        "(e.g. <answer>, so a small model answers inside the tags); it counts as part of the response scored.",
    )
    max_prompt_length: int = field(128, "Longest prompt in tokens.", ge=1)
    max_response_length: int = field(256, "Longest response in tokens.", ge=1)
    temperature: float = field(1.0, "Sampling temperature of training rollouts.", ge=0)
    top_p: float = field(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = field(-1, "Top-k sampling (-1 = off).")
    response_lengths: Literal["natural", "long_tail"] = field(
        "natural",
        "natural: responses end at end-of-sequence; long_tail: each request's length is drawn from a "
        "log-normal distribution (benchmarks of reasoning-like long tails; end-of-sequence is ignored).",
    )
    long_tail_median: int = field(64, "long_tail: median response length in tokens.", ge=1)
    long_tail_sigma: float = field(1.0, "long_tail: sigma of the log-normal (larger = heavier tail).", ge=0)


class Topology(Section):
    n_rollout_instances: int = field(2, "Rollout instances (one engine each).", ge=1)
    n_trainer_ranks: int = field(1, "Data-parallel trainer ranks.", ge=1)
    n_ps_shards: int = field(2, "Parameter-server shards; tensors are balanced across them by bytes.", ge=1)
    device: Literal["auto", "cpu", "cuda"] = field("auto", "Device of engines and trainer (auto = cuda if present).")
    threads_per_actor: int = field(1, "torch intra-op threads per actor process (0 = torch default).", ge=0)
    trainer_threads: int | Literal["auto"] = field(
        "auto",
        "torch intra-op threads of each trainer rank. auto: on CPU, after every version the trainer takes "
        "the cores the other processes left idle since the last one (at least one; psrl.trainer.threads): "
        "a step that is mostly training (a larger model, short answers) gets the rollout's idle cores, a "
        "saturated host keeps one; where one thread more is plausible it is tried for two versions and kept if "
        "the versions came faster; on CUDA, threads_per_actor. A number fixes it; 0 = threads_per_actor.",
    )
    cpu_placement: Switch = field(
        "auto",
        "On a CPU-only host with one trainer rank, every actor local, trainer_threads=auto and "
        "threads_per_actor=1: after every version the launcher "
        "gives the trainer the cores the other actors leave free and keeps those on the rest, so their "
        "wake-ups do not preempt its step (launch.cpu_placement). auto: where those hold and while the host "
        "is not busy with other work; on: also then, and a run where they do not hold is refused; off: the "
        "scheduler places every process.",
    )
    fork_server: bool = field(
        True,
        "Start this host's actors (and their replacements) as forks of one process that imported their "
        "modules once; off: each actor is a fresh interpreter that imports its own.",
    )
    trainer_gpus: list[int] = field(
        [],
        "GPU indices of the trainer ranks (rank r sees only trainer_gpus[r]); empty = every process sees all "
        "GPUs and uses the first.",
    )
    rollout_gpus: list[int] = field(
        [],
        "GPU indices of the rollout instances (instance i sees only rollout_gpus[i % n], so instances may "
        "share a GPU); empty = every process sees all GPUs and uses the first.",
    )
    warm_spares: int = field(
        1,
        "Idle actor processes per host with the heavy modules (torch, the actor modules) already imported; a "
        "dead actor's replacement becomes one of them instead of a cold process (0 = always start cold). Kept "
        "only while no fork server serves the host (topology.fork_server=false, or after it died): a replacement "
        "forked from the server is as warm, and a spare's imports take CPU from the run.",
        ge=0,
    )
    restart_rollout: bool = field(
        True,
        "Restart a rollout instance that dies; off: an instance lost for good is not replaced: its requests "
        "continue on the other instances from their tokens and the run goes on with fewer "
        "(it fails when none is left).",
    )
    max_rollout_instances: int = field(
        0,
        "The most rollout instances `psrl scale` may run at once (0 = one per rollout_gpus entry when that list "
        "is set, else one per CPU core of the launching host; never fewer than n_rollout_instances).",
        ge=0,
    )
    drain_timeout_s: float = field(
        30.0,
        "How long an instance removed by `psrl scale` may take to hand its requests back before it is stopped "
        "anyway (what it still held then continues from the tokens the router received).",
        gt=0,
    )
    colocate: bool = field(
        False,
        "Trainer ranks and rollout instances share the same GPUs and take turns: rollout releases its memory "
        "while the trainer steps on a full buffer, the trainer while rollout fills the next one (psrl.tms.range).",
    )
    cluster: str | None = field(
        None,
        "Where the actors run: unset = this machine (or the hosts of --hosts); 'ray' or 'ray:ADDRESS' = a "
        "running Ray cluster (the ray extra); 'slurm' = the Slurm allocation the launcher runs in "
        "(`psrl launch --cluster` sets it).",
        pattern=r"^(ray(:\S+)?|slurm)$",
    )
    cluster_strategy: Literal["PACK", "SPREAD"] = field(
        "PACK",
        "Ray placement-group strategy: PACK fills few nodes (GPUs of one rank group together), SPREAD puts "
        "each reserved bundle on a different node where it can.",
    )
    cluster_shared_dir: bool = field(
        False,
        "The run directory is on a filesystem every cluster node mounts at the same path (NFS, Lustre): "
        "trainer ranks and PS shards on other nodes write their checkpoints and snapshots there (actors on "
        "the launcher's machine always do).",
    )


class EngineSettings(Section):
    backend: Literal["embedded", "vllm"] = field(
        "embedded",
        "Rollout engine: psrl's own, or vLLM (the vllm extra: `make install-vllm` on a CPU, "
        "`pip install -e '.[vllm]'` with CUDA).",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = field(
        "auto", "Engine weight dtype (auto: bf16 on GPU, fp32 on CPU)."
    )
    block_size: int = field(16, "Tokens per KV-cache block (vLLM on a CPU: a multiple of 32).", ge=1)
    num_kv_blocks: int = field(512, "KV-cache blocks per instance.", ge=1)
    max_num_seqs: int = field(64, "Largest decode batch.", ge=1)
    max_num_batched_tokens: int = field(2048, "Token budget of one engine step (prefill chunking).", ge=1)
    enable_prefix_caching: bool = field(True, "Reuse KV of identical prompt prefixes.")
    max_model_len: int | None = field(
        None,
        "Context limit in tokens; unset = the model's max_position_embeddings (always capped by KV capacity).",
        ge=2,
    )
    seed: int = field(0, "Seed of the engine's sampling stream for requests without their own seed.")
    cuda_graphs: bool = field(
        True, "Replay decode steps as CUDA graphs on CUDA (both backends; vLLM: False = enforce_eager)."
    )
    cpu_kernels: Switch = field(
        "auto",
        "Fused fp32 CPU decode kernels, built with the system C compiler on first use (embedded engine, CPU, "
        "float32): auto = use them when they can be built, else warn and decode in eager torch; on = fail instead.",
    )
    vllm_args: dict[str, Any] = field(
        {},
        "Further vLLM engine arguments (fields of vllm's EngineArgs) for engine.backend=vllm, e.g. "
        "engine.vllm_args.gpu_memory_utilization=0.8; checked by vLLM before anything starts. The typed fields "
        "above set their vLLM counterparts (num_kv_blocks -> num_gpu_blocks_override, cuda_graphs=False -> "
        "enforce_eager) and cannot be set here.",
    )
    gpu_kernels: Switch = field(
        "auto",
        "Triton step kernels for prefill and decode rounds (embedded engine, CUDA): auto = use them when Triton "
        "imports, else warn and keep the torch path; on = fail instead; off = the torch path.",
    )
    decode_steps: int = field(
        16,
        "Decode steps per scheduling round with the GPU step kernels: tokens are sampled on the device and "
        "stop tokens truncated after the round (1 = one token per step).",
        ge=1,
    )
    capture_graphs_at_start: bool = field(
        False,
        "Capture the decode rounds' CUDA graphs of every batch size when an instance starts (embedded engine, "
        "CUDA, step kernels), as vLLM does, so no instance stops for a capture mid-run. Off by default: on a "
        "fresh H100 the 38 graphs of a 0.5B model with 256 sequences took 20.6 s before the first batch, while "
        "captures on first use did not show in the run's throughput.",
    )
    capture_graphs_when_idle: bool | Literal["auto"] = field(
        "auto",
        "While an instance has nothing to decode (before its first batch, or held back by the staleness bound "
        "until the trainer catches up), capture one batch size's decode round not yet captured per idle turn "
        "of its loop, largest first, so the rounds that follow do not stop for it (each capture stops an "
        "instance 0.4-2.3 s on an H100 with a 0.5B model). A request that arrives during a capture waits for "
        "that one. auto: wherever the decode rounds replay CUDA graphs (embedded engine, CUDA, step kernels, "
        "engine.cuda_graphs); false = capture each on first use.",
    )
    lora_mode: Literal["merge", "unmerged"] = field(
        "merge",
        "How the embedded engine applies LoRA adapter versions (actor.lora.rank > 0): merge = into the base weights "
        "of the targeted projections on load; unmerged = keep the base weights and add (x @ A^T) @ B^T * alpha/rank "
        "in those projections (loads copy only the adapters; every step pays two small matmuls per projection). "
        "The vLLM backend always serves adapters through vLLM's own LoRA support.",
    )


class Bus(Section):
    transport: Literal["ipc", "tcp"] = field("ipc", "Socket transport on one machine; across hosts tcp is used.")
    host: str = field("127.0.0.1", "Address the run's sockets bind to on this host (loopback by default).")
    curve: Switch = field("auto", "ZeroMQ CURVE encryption: auto = on whenever actors span several hosts.")
    hwm: int = field(100_000, "High-water mark of event sockets (messages).", ge=0)
    heartbeat_interval_ms: int = field(250, "Actor heartbeat period.", ge=10)
    heartbeat_misses: int = field(8, "Missed heartbeats before an actor is declared dead.", ge=1)
    base_port: int = field(
        47100, "First tcp port of the actors' request sockets when a run spans hosts (4 ports per actor).", ge=1024
    )
    handshake_timeout_s: float = field(180.0, "How long the launcher waits for every actor to report ready.", gt=0)
    array_frame_bytes: int = field(
        65536, "Arrays at least this large travel as zero-copy trailing frames, smaller ones inline.", ge=0
    )
    max_message_mib: int = field(64, "Largest message a receiver accepts; larger ones are dropped and counted.", ge=1)
    log_segment_mib: int = field(64, "Event-log segment size before the logger starts a new segment.", ge=1)


class RunSettings(Section):
    name: str | None = field(None, "Run name; unset = a timestamp.")
    root: str = field("runs", "Directory under which run directories are created.")
    log_level: Literal["debug", "info", "warning", "error"] = field("info", "Console log level.")
    fsync: Literal["never", "segment", "always"] = field(
        "segment", "Event-log fsync policy: never, at segment rotation, or after every record."
    )
    stall_timeout_s: float = field(
        600.0,
        "No training step for this long (twice as long before the first) while work waits: the launcher "
        "names who holds it and restarts them once, then ends the run resumably (0 = never). Set it above "
        "your slowest step.",
        ge=0,
    )


class Env(Section):
    enable: bool = field(
        False,
        "Multi-turn sessions: each trajectory alternates generation turns with steps of the task's environment "
        "(task.name must name an environment, see psrl.envs); a session scheduler actor runs the environments.",
    )
    max_turns: int = field(4, "Most generation turns of one session; the episode ends after the last.", ge=1)
    max_turn_tokens: int = field(24, "Generation budget of one turn (tokens).", ge=1)
    num_workers: int = field(2, "Environment worker processes (steps run in parallel up to this many).", ge=1)
    step_timeout_s: float = field(10.0, "An environment step running longer fails its session.", gt=0)
    latency_ms: float = field(0.0, "Mean extra wall time of one environment step (models slow tools).", ge=0)
    latency_distribution: Literal["fixed", "exponential", "lognormal"] = field(
        "exponential", "Distribution of the extra step time around latency_ms (lognormal: sigma 1)."
    )
    worker_retry_limit: int = field(
        1, "Times a step is run again after its env worker died (SIGKILL, crash) before its session fails.", ge=0
    )
