"""Key spellings beyond the schema: accepted aliases, retired paths and upstream-only fields.

Upstream PSRL keys that have no meaning in psrl are refused with the reason, never silently
accepted; keys that moved are refused with their new path.
"""

from __future__ import annotations

RC = "psrl.rollout_coordination."

# Accepted alternative spellings (veRL-style trees used in the user's documents).
ALIASES: dict[str, str] = {
    "train_actor_rollout_ref.actor.": "actor.",
    "actor_rollout_ref.actor.": "actor.",
    "train_actor_rollout_ref.critic.": "critic.",
    "psrl.deployment.n_rollout_instances": "topology.n_rollout_instances",
}

# Paths that moved: old prefix -> new prefix.
MOVED: dict[str, str] = {
    "psrl.partial_rollout.": RC + "partial_rollout.",
    "psrl.redundant_rollout.": RC + "redundant_rollout.",
    "psrl.routing_strategy.": RC + "routing_strategy.",
    "psrl.sync_and_mig_strategy.": RC + "sync_and_mig_strategy.",
    "psrl.proactive_filter_strategy.": RC + "proactive_filter_strategy.",
    "psrl.session_strategy.": RC + "session_strategy.",
    "psrl.agentic_rl.sticky_session": RC + "routing_strategy.enable_trajectory_sticky",
    RC + "routing_strategy.enable_group_sampling_on_multi_instances": RC + "routing_strategy.enable_group_sticky",
    "psrl.lmcache.eviction_policy": "psrl.lmcache.cache_policy",
    "psrl.lmcache.p2p_transport": "psrl.lmcache.p2p_transfer_channel",
    "psrl.group_post_process.": "algorithm.filter_groups.",
    "psrl.logging_path": "run.root",
    "psrl.ps_mode": "psrl.ps.transport",
    "data.max_prompt_length": "task.max_prompt_length",
    "data.max_response_length": "task.max_response_length",
    "actor_rollout_ref.model.path": "model.path",
}

_NO_GATEWAY = "psrl routes on its own router actor; there is no SMG gateway process"
_NO_RAY = "psrl's parameter server is a set of shard actors on the bus, not a Ray PSManager"

# Upstream-only paths (prefix -> why they do not apply).
NOT_APPLICABLE: dict[str, str] = {
    "psrl.ps_manager_ip": _NO_RAY + "; addresses come from the hosts file",
    "psrl.reward_service_ip": "rewards are computed by reward.function (or the task) inside the coordinator",
    "custom_reward_function.": "write reward.function=path/to/file.py:function_name",
    "psrl.nixl.": "NIXL metadata is exchanged over the bus; choose it with psrl.ps.transport=nixl",
    "psrl.broadcast_init.": "PS shards partition the model, so no full-replica broadcast is needed",
    "psrl.checkpoint.": "Megatron checkpoint options; the trainer writes torch checkpoints in the run directory",
    "psrl.rollout_gateway.": _NO_GATEWAY,
    "psrl.server_rollout.": _NO_GATEWAY,
    "psrl.memory_logger.": "GPU memory is reported in status snapshots",
    "psrl.profile.": "analysis-only switches of upstream vLLM patches",
    "psrl.deployment.": "placement is given by psrl.topology and --hosts",
    "psrl.colocate": "train/rollout GPU sharing is not part of psrl",
    "psrl.colocate_validate_and_train": "validation instances are not part of psrl",
    "psrl.fuse_rollout_with_validate": "validation instances are not part of psrl",
    "psrl.val_rollout_n": "validation instances are not part of psrl",
    "psrl.buffer_post_process.": "use algorithm.filter_groups (applied per group as it completes)",
    "psrl.retry_bound": "unread upstream placeholder",
    "psrl.retry_ratio": "unread upstream placeholder",
    "psrl.agentic_rl.trajectory_output.": "every trajectory is in the run's event log (`psrl replay`)",
    "psrl.status_collection.coordinator_sync_interval_in_ms": _NO_GATEWAY,
    "psrl.status_collection.dump_logging_to_file_": "every event is in the run's event log",
    RC + "routing_strategy.check_interval_in_ms": "the router reacts to events and does not poll",
    RC + "routing_strategy.logging_interval_in_ms": "unread upstream placeholder",
    RC + "routing_strategy.snapshot_staleness_threshold_in_ms": "unread upstream placeholder",
    RC + "routing_strategy.kv_transfer.stats_log_interval_s": "transfer statistics are events in the log",
    RC + "routing_strategy.kv_query_timeout_ms": "legacy Ray router option",
    "psrl.lmcache.config_file": "LMCache is configured from the psrl.lmcache fields only",
    "psrl.lmcache.reserve_local_cpu_size": "offload memory is bounded by offload_size_gb",
    "psrl.lmcache.save_unfull_chunk": "known-broken upstream option",
    "psrl.lmcache.enable_async_loading": "known-broken upstream option",
    "psrl.lmcache.controller_": "no separate LMCache controller process",
    "psrl.lmcache.remote_url": "the remote tier is not available",
    "bus.request_timeout_ms": "actors talk over one-way links ordered per peer; nothing waits for a reply",
    "bus.request_retries": "actors talk over one-way links ordered per peer; nothing waits for a reply",
    "rollout_gateway.": _NO_GATEWAY,
    "transfer_queue.": "trajectories travel on the bus and are held by the coordinator",
}


def _match(path: str, table: dict[str, str]) -> tuple[str, str] | None:
    for key, value in table.items():
        if path == key or (key.endswith(".") and path.startswith(key)) or (key.endswith("_") and path.startswith(key)):
            return key, value
    return None


def apply_alias(path: str) -> str:
    hit = _match(path, ALIASES)
    if hit is None:
        return path
    key, target = hit
    return target + path[len(key) :] if key.endswith(".") else target


def moved_to(path: str) -> str | None:
    hit = _match(path, MOVED)
    if hit is None:
        return None
    key, target = hit
    return target + path[len(key) :] if key.endswith(".") else target


def not_applicable(path: str) -> str | None:
    hit = _match(path, NOT_APPLICABLE)
    return None if hit is None else hit[1]
