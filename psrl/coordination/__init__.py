"""Coordination decisions (pure): weight sync, migration, and multi-turn session scheduling.

The coordinator actor builds a ``CoordinationInputs`` each tick and calls ``decide_tick``; the
session scheduler calls ``schedule_sessions``. Every decision is a function of its inputs only.
"""

from psrl.coordination.hypothesis import SyncBenefit, estimate_sync_benefit
from psrl.coordination.migration import MigrationDecision, decide_migration, starved_instances
from psrl.coordination.session import (
    ContinueOrder,
    InstanceCapacity,
    SessionDecision,
    SessionInfo,
    schedule_sessions,
)
from psrl.coordination.state import CoordinationInputs, InstanceState, RouterFacts, load_indicator, safe_ratio
from psrl.coordination.sync import SyncDecision, SyncPolicy
from psrl.coordination.tick import TickDecision, decide_tick

__all__ = [
    "ContinueOrder",
    "CoordinationInputs",
    "InstanceCapacity",
    "InstanceState",
    "MigrationDecision",
    "RouterFacts",
    "SessionDecision",
    "SessionInfo",
    "SyncBenefit",
    "SyncDecision",
    "SyncPolicy",
    "TickDecision",
    "decide_migration",
    "decide_tick",
    "estimate_sync_benefit",
    "load_indicator",
    "safe_ratio",
    "schedule_sessions",
    "starved_instances",
]
