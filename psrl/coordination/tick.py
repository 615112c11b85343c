"""One coordinator tick: sync is considered first, migration only if no sync was triggered."""

from __future__ import annotations

import msgspec

from psrl.config.coordination import SyncAndMigStrategy
from psrl.coordination.migration import MigrationDecision, decide_migration
from psrl.coordination.state import CoordinationInputs
from psrl.coordination.sync import SyncDecision, SyncPolicy


class TickDecision(msgspec.Struct, frozen=True, gc=False):
    sync: SyncDecision
    migration: MigrationDecision | None


def decide_tick(inputs: CoordinationInputs, sync_policy: SyncPolicy, settings: SyncAndMigStrategy) -> TickDecision:
    """Sync decision, then migration when nothing syncs now and no instance is mid-sync."""
    sync = sync_policy.decide(inputs)
    if sync.instance_ids or any(inst.is_syncing for inst in inputs.instances):
        return TickDecision(sync, None)
    return TickDecision(sync, decide_migration(inputs, settings.mig))
