"""Routing policies, one per ``routing_strategy.method``; ``make_policy`` builds the configured one."""

from __future__ import annotations

from psrl.config.coordination import RoutingStrategy
from psrl.engine_cost.model import CostModel
from psrl.routing.policies.balance import RandomPolicy, RequestNumBalancePolicy, RoundRobinPolicy
from psrl.routing.policies.base import Choice, Groups, RoutingPolicy
from psrl.routing.policies.cache_aware import CacheAwareRoutingPolicy
from psrl.routing.policies.throughput import ThroughputOptimalPolicy

__all__ = [
    "CacheAwareRoutingPolicy",
    "Choice",
    "Groups",
    "RandomPolicy",
    "RequestNumBalancePolicy",
    "RoundRobinPolicy",
    "RoutingPolicy",
    "ThroughputOptimalPolicy",
    "make_policy",
]


def make_policy(settings: RoutingStrategy, cost_model: CostModel | None = None) -> RoutingPolicy:
    """The policy named by ``settings.method``; throughput_optimal* need ``cost_model``."""
    method = settings.method
    if method == "random":
        return RandomPolicy(settings.seed)
    if method == "round_robin":
        return RoundRobinPolicy()
    if method == "request_num_balance":
        return RequestNumBalancePolicy()
    if method in ("throughput_optimal", "throughput_optimal_with_budget"):
        if cost_model is None:
            raise ValueError(f"routing method {method} needs a cost model (routing_strategy.cost_model_path)")
        budget = settings.request_budget if method == "throughput_optimal_with_budget" else None
        return ThroughputOptimalPolicy(cost_model, settings.delta_throughput_threshold, budget)
    if method in ("cache_aware", "cache_aware_v1"):
        return CacheAwareRoutingPolicy(settings.cache_aware_policy, multi_tier=method == "cache_aware_v1")
    raise ValueError(f"unknown routing method {method!r}")
