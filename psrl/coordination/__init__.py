"""Coordination decisions (pure): weight sync, migration, multi-turn sessions, and what goes to the trainer.

    state       what a decision reads (CoordinationInputs: instances, router facts, the PS version)
    sync        SyncPolicy: which instances load the published version now (greedy, status_based)
    migration   decide_migration: move requests from a busy instance to a starved one
    tick        decide_tick: one coordinator tick, sync first and migration only without a sync
    records     a tick as logged for replay
    session     schedule_sessions: hang and continue multi-turn sessions
    groups      prompt groups, their results and rewards, the group filter
    chunks      how buffers go to the trainer: the chunk plan and ChunkEmitter
    instances   the coordinator's view of the fleet
    scaling     decide_scale: which rollout instances a scale request adds or removes (elastic rollout)

Every decision is a function of its inputs only; ``psrl.flows.coordinator`` drives them.
"""
