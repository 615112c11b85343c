"""`psrl.rollout_coordination.*`: partial and redundant rollout, routing, sync/migration,
proactive filter and session strategy. Defaults are the shipped ones of the user's documents."""

from __future__ import annotations

from typing import Literal

from psrl.config.base import Section, field, section

RoutingMethod = Literal[
    "random",
    "round_robin",
    "request_num_balance",
    "throughput_optimal",
    "throughput_optimal_with_budget",
    "cache_aware",
    "cache_aware_v1",
]
SyncIndicator = Literal["request_num", "throughput", "kv_cache", "hypothesis_test"]
LoadIndicator = Literal["request_num", "throughput", "kv_cache"]


class PartialRollout(Section):
    enable: bool = field(True, "Interrupt generation at a version boundary, keep the tokens and continue.")
    interrupt_as_prompt: bool = field(
        False,
        "Continue an interrupted trajectory as a new prompt (prompt + partial output) instead of "
        "looping the live request back through routing.",
    )


class RedundantRollout(Section):
    enable: bool = field(False, "Launch more work than the algorithm needs and drop stragglers.")
    alg_global_batch_size: int | None = field(
        None, "Prompt groups per step the algorithm needs (B); unset = psrl.staleness_buffer_entries."
    )
    redundant_global_batch_size: int | None = field(
        None, "Prompt groups launched per buffer (B' >= B); unset = alg_global_batch_size."
    )
    alg_rollout_n: int | None = field(None, "Responses per prompt the algorithm needs (N); unset = psrl.rollout_n.")
    redundant_rollout_n: int | None = field(None, "Responses launched per prompt (N' >= N); unset = alg_rollout_n.")


class CacheAwarePolicy(Section):
    cache_threshold: float = field(0.0, "Minimum prefix match ratio to prefer the best-matching instance.")
    gpu_overlap_weight: float = field(1.0, "Score weight of prefix blocks resident in the engine's KV cache.")
    lmcache_overlap_weight: float = field(
        0.0, "Score weight of prefix blocks in the offloaded (CPU) tier; cache_aware_v1 only (about 0.5 with offload)."
    )
    balance_abs_threshold: int = field(16, "Load spread (requests) above which routing falls back to shortest queue.")
    balance_rel_threshold: float = field(1.5, "Relative load spread (max/min) for the shortest-queue fallback.")
    balance_token_usage_threshold: float = field(
        0.75, "KV usage fraction of any instance that triggers shortest-queue balancing (>= 1 disables)."
    )
    overload_token_usage_threshold: float = field(
        1.0, "KV usage fraction at which an instance counts as overloaded and is skipped (>= 1 disables)."
    )
    eviction_interval_secs: int = field(60, "Period of the routing radix tree's LRU eviction.")
    max_tree_size: int = field(67_108_864, "Cap on tokens held by the routing radix tree per instance.")
    block_size: int = field(16, "Tokens per KV block used to align prefix matches.")
    kv_capacity_threshold: float = field(
        2.0, "cache_aware_v1 admission: refuse if used + new tokens > threshold x KV capacity (2.0 = off)."
    )


class KvTransfer(Section):
    enable: bool = field(False, "Move a request's KV to the new instance when it is re-routed.")
    transfer_mode: Literal["async", "sync", "pin_sync"] = field(
        "async", "async: start at once and re-prefill if late; sync: wait; pin_sync: pin source blocks and wait."
    )
    transfer_timeout_ms: int = field(5000, "Wait limit for sync / pin_sync before falling back to re-prefill.")


class RoutingStrategy(Section):
    method: RoutingMethod = field("request_num_balance", "Routing policy that ranks eligible instances.")
    seed: int = field(0, "Seed of the random policy (each decision's draw depends only on seed and decision number).")
    cost_model_path: str | None = field(
        None, "JSON cost model (from `psrl calibrate`); required by throughput_optimal*."
    )
    delta_throughput_threshold: float = field(
        0.5, "Accept an instance only if its marginal throughput gain >= this x single-request throughput."
    )
    request_budget: int = field(1024, "Token rounding unit for response-length estimates (_with_budget).")
    enable_multi_priority_queue: bool = field(False, "Queue requests by trajectory version; oldest first.")
    admission_reject_on_waiting: bool = field(
        True, "Do not send new requests to an instance whose engine queue has waiting requests."
    )
    max_num_waiting_reqs_after_preemption: int = field(
        1024, "After preemption, loop requests back to the router once the engine's waiting queue exceeds this."
    )
    max_concurrent_seqs_per_instance: int = field(1024, "In-flight request cap per instance (0 = no cap).")
    enable_trajectory_sticky: bool = field(False, "Pin a trajectory's later turns and loopbacks to its instance.")
    enable_group_sticky: bool = field(False, "Pin all responses of one prompt to the same instance.")
    request_sort_indicator: Literal["small_id", "short_length", "long_length"] = field(
        "small_id", "Order of requests within one queue level."
    )
    candidate_sort_indicator: Literal["version", "reserve_capability"] = field(
        "version", "Order of eligible instances before the policy ranks them."
    )
    cache_aware_policy: CacheAwarePolicy = section(CacheAwarePolicy, "Knobs of cache_aware / cache_aware_v1.")
    kv_transfer: KvTransfer = section(KvTransfer, "KV movement on re-routing.")


class SyncStrategy(Section):
    indicator: SyncIndicator = field("request_num", "status_based: the instance metric compared with threshold.")
    threshold: float | None = field(
        None, "status_based: sync when the indicator is <= this (requests, tokens/s or KV fraction)."
    )
    check_req_before_sync: bool = field(
        True, "Postpone a sync while queued requests can still run on the instance's current version."
    )
    seamless_train_version: int = field(
        0, "For PS versions <= this, sync only once that version's buffer is ready (warm-up guard)."
    )
    hypothesis_horizon_s: float = field(
        30.0,
        "hypothesis_test: horizon over which syncing now is compared with waiting, used until the "
        "interval between PS versions has been measured.",
        gt=0,
    )
    hypothesis_pull_s: float = field(
        2.0, "hypothesis_test: expected weight-pull time of an instance whose pulls have not been measured.", ge=0
    )


class MigrationStrategy(Section):
    enable: bool = field(False, "Abort requests of an overloaded instance so the router re-places them.")
    indicator: LoadIndicator = field("request_num", "Load metric used for the imbalance ratio.")
    threshold: float | None = field(None, "Migrate when busiest/idlest load ratio exceeds this.")
    stop_indicator: LoadIndicator = field("request_num", "Metric of the busiest instance checked before migrating.")
    stop_threshold: float | None = field(
        None, "Migrate only while the busiest instance's stop_indicator is at least this."
    )
    scope: Literal["all", "excess"] = field(
        "all",
        "all: abort every request of the busy instance; excess: only enough to even it with the starved one.",
    )


class SyncAndMigStrategy(Section):
    method: Literal["greedy", "status_based"] = field(
        "greedy", "greedy: sync as soon as a version is published; status_based: wait for a low point."
    )
    check_interval_in_ms: int = field(100, "Coordinator tick for sync and migration decisions.")
    sync: SyncStrategy = section(SyncStrategy, "When an instance pulls new weights.")
    mig: MigrationStrategy = section(MigrationStrategy, "Load balancing by aborting and re-routing.")


class ProactiveFilterStrategy(Section):
    method: Literal["retry", "truncate"] | None = field(
        None, "What to do with the last stragglers of a stuck buffer: retry (re-dispatch) or truncate."
    )
    threshold: int = field(0, "Act when the buffer misses at most this many groups.")


class ThunderAgent(Section):
    enable: bool = field(False, "Capacity-based hang/continue scheduling of multi-turn sessions.")
    check_interval_in_ms: int = field(1000, "Scheduler tick.")
    env_token_weight: float | None = field(
        None,
        "Weight of the KV held by sessions that are calling their environment. Unset: 0.0 with the KV offload "
        "tier on (psrl.lmcache.enable: the tier keeps what a resting session's blocks give up, so they hold "
        "no room a running turn needs), else 1.0.",
        ge=0,
    )
    buffer_per_session: int = field(100, "Decode headroom reserved per running session (tokens).")
    continue_scope: Literal["bucketed", "global"] = field(
        "bucketed", "bucketed: readmit on the same instance; global: best-fit-decreasing over all instances."
    )
    continue_force_pin: bool = field(False, "Pin the next turn of a continued session to the chosen instance once.")
    max_hang_s: float = field(
        0.0,
        "A session hung this long is continued first, oldest first, and nothing hung less long passes it "
        "(bounds a session's wait by this plus the time its room takes to free); 0 = smallest first only.",
        ge=0,
    )
    ready_first: bool = field(
        True,
        "Continue hung sessions whose next turn is ready (their environment answered) before those still at "
        "their environment, longest waiting first; false: smallest first only (ThunderAgent's order).",
    )
    max_ready_wait_s: float = field(
        0.0,
        "With ready_first: a ready turn that has waited this long for room is continued at once on its "
        "instance, by hanging sessions there that are at their environment (bounds what hanging adds to "
        "time to first token, trading some of the working set's reuse); 0 = off.",
        ge=0,
    )

    @property
    def env_weight(self) -> float:
        """``env_token_weight`` as the scheduler reads it (1.0 where no config resolved it)."""
        return 1.0 if self.env_token_weight is None else self.env_token_weight


class SessionStrategy(Section):
    thunder_agent: ThunderAgent = section(ThunderAgent, "ThunderAgent hang/continue scheduler.")


class RolloutCoordination(Section):
    partial_rollout: PartialRollout = section(PartialRollout, "Interrupt and continue at version boundaries.")
    redundant_rollout: RedundantRollout = section(RedundantRollout, "Batch- and group-level over-provisioning.")
    routing_strategy: RoutingStrategy = section(RoutingStrategy, "Worker selection and routing policy.")
    sync_and_mig_strategy: SyncAndMigStrategy = section(SyncAndMigStrategy, "Weight sync timing and migration.")
    proactive_filter_strategy: ProactiveFilterStrategy = section(
        ProactiveFilterStrategy, "Handling of stuck staleness buffers."
    )
    session_strategy: SessionStrategy = section(SessionStrategy, "Multi-turn session scheduling.")
