"""The comparison the simulator prints: routing methods and sync settings against the synchronous baseline.

Every variant is a list of config overrides applied on top of the user's base config (preset and
overrides), so the workload, the fleet and the trainer stay the same across rows. ``SYNC`` is the
synchronous baseline (staleness 0, no partial or redundant rollout, no migration); ``PSRL`` is the
user's reasoning profile (configs/reasoning.yaml) at staleness 2 with partial rollout. The routing
rows change only the routing method of ``PSRL``; the sync rows change the staleness bound or the
sync strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from psrl.config.coordination import RoutingMethod

RC = "psrl.rollout_coordination."
ROUTING = RC + "routing_strategy."
SYNC_MIG = RC + "sync_and_mig_strategy."


@dataclass(frozen=True)
class Variant:
    label: str
    overrides: tuple[str, ...]

    def plus(self, label: str, *overrides: str) -> Variant:
        return Variant(label, (*self.overrides, *overrides))


SYNC = Variant(
    "sync: eta=0, no partial rollout",
    ("psrl.staleness=0", f"{RC}partial_rollout.enable=false", f"{RC}redundant_rollout.enable=false",
     f"{SYNC_MIG}method=greedy", f"{SYNC_MIG}mig.enable=false"),
)  # fmt: skip

PSRL = Variant(
    "psrl: eta=2, partial, reasoning",
    ("psrl.staleness=2", f"{RC}partial_rollout.enable=true", f"{ROUTING}method=request_num_balance",
     f"{ROUTING}max_num_waiting_reqs_after_preemption=0", f"{SYNC_MIG}method=greedy", f"{SYNC_MIG}mig.enable=true",
     f"{SYNC_MIG}mig.indicator=request_num", f"{SYNC_MIG}mig.threshold=5",
     f"{SYNC_MIG}mig.stop_indicator=request_num", f"{SYNC_MIG}mig.stop_threshold=10"),
)  # fmt: skip

# cache_aware_v1 adds the offloaded KV tier to cache_aware; the simulator models no tier.
ROUTING_METHODS = tuple(m for m in get_args(RoutingMethod) if m != "cache_aware_v1")


def sync_variants() -> list[Variant]:
    return [
        SYNC,
        PSRL.plus("psrl, eta=1", "psrl.staleness=1"),
        PSRL,
        PSRL.plus("psrl, no partial rollout", f"{RC}partial_rollout.enable=false", f"{SYNC_MIG}mig.enable=false"),
        PSRL.plus(
            "psrl, status_based request_num<=4",
            f"{SYNC_MIG}method=status_based",
            f"{SYNC_MIG}sync.indicator=request_num",
            f"{SYNC_MIG}sync.threshold=4",
        ),
        PSRL.plus(
            "psrl, status_based hypothesis_test",
            f"{SYNC_MIG}method=status_based",
            f"{SYNC_MIG}sync.indicator=hypothesis_test",
        ),
    ]


def routing_variants() -> list[Variant]:
    return [PSRL.plus(f"psrl, routing {method}", f"{ROUTING}method={method}") for method in ROUTING_METHODS]


THUNDER = RC + "session_strategy.thunder_agent.enable"


def agentic_variants() -> list[Variant]:
    """The agentic profile's settings on the user's base config (multi-turn sessions, e.g. ``agentic``):
    (a) balancing, (b) cache-aware sticky routing, (c) (b) with ThunderAgent (the modelled engines keep
    each session's prefix cache; the offload tier is not modelled)."""
    balance = Variant(
        "a: request_num_balance",
        (f"{ROUTING}method=request_num_balance", f"{ROUTING}enable_trajectory_sticky=false", f"{THUNDER}=false"),
    )
    sticky = Variant(
        "b: cache_aware_v1 + sticky",
        (f"{ROUTING}method=cache_aware_v1", f"{ROUTING}enable_trajectory_sticky=true", f"{THUNDER}=false"),
    )
    return [balance, sticky, sticky.plus("c: b + ThunderAgent", f"{THUNDER}=true")]


def comparison(kind: str) -> list[Variant]:
    """``sync``, ``routing``, ``all`` (sync rows first; the PSRL row appears once) or ``agentic``."""
    if kind == "agentic":
        return agentic_variants()
    if kind == "sync":
        return sync_variants()
    if kind == "routing":
        return [SYNC, *routing_variants()]
    if kind == "all":
        return [*sync_variants(), *(v for v in routing_variants() if not v.label.endswith("request_num_balance"))]
    raise ValueError(f"unknown comparison {kind!r} (sync, routing, all or agentic)")
