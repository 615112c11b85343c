"""Full recount of a ledger's state against its incremental counters.

O(groups): for tests, replays and debugging, never on the routing path. Raises `LedgerError`
naming the first broken invariant (numbering as in the ledger's docstring).
"""

from __future__ import annotations

from collections import Counter

from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.types import GroupState, LedgerError


def check_invariants(ledger: StalenessLedger) -> None:
    """Raise `LedgerError` if any invariant of `StalenessLedger` does not hold."""
    _check_groups(ledger)
    _check_buffers(ledger)
    _check_indexes(ledger)


def _check_groups(ledger: StalenessLedger) -> None:
    eta, next_buffer = ledger.sizes.staleness, ledger.next_buffer_id
    for prompt_id, group in ledger._groups.items():
        if prompt_id in ledger._closed:
            raise LedgerError(f"3: prompt {prompt_id} is both live and closed")
        versions = [group.child_versions[c] for c in group.winners] if group.winners else group.child_versions.values()
        if group.version != min(versions):
            raise LedgerError(f"2: prompt {prompt_id} version {group.version} != min child version {min(versions)}")
        if max(versions) > next_buffer:
            raise LedgerError(f"6: prompt {prompt_id} has a version newer than buffer {next_buffer}")
        buffer_id = group.buffer_id
        if buffer_id is None:
            if group.state == GroupState.OCCUPIED:
                raise LedgerError(f"3: occupied prompt {prompt_id} has no buffer")
            continue
        if buffer_id < next_buffer:
            raise LedgerError(f"1: prompt {prompt_id} points at consumed buffer {buffer_id}")
        if not max(versions) <= buffer_id <= group.version + eta:
            raise LedgerError(f"1: prompt {prompt_id} (versions {sorted(versions)}) sits in buffer {buffer_id}")
        if group.state != GroupState.IN_FLIGHT and len(group.winners) != ledger.sizes.alg_rollout_n:
            raise LedgerError(f"3: prompt {prompt_id} has {len(group.winners)} winners")


def _check_buffers(ledger: StalenessLedger) -> None:
    sizes = ledger.sizes
    occupied: Counter[int] = Counter()
    reserved: Counter[int] = Counter()
    for group in ledger._groups.values():
        if group.buffer_id is not None:
            (occupied if group.state == GroupState.OCCUPIED else reserved)[group.buffer_id] += 1
    for buffer_id, buffer in ledger._buffers.items():
        if buffer_id < ledger.next_buffer_id:
            raise LedgerError(f"3: consumed buffer {buffer_id} still exists")
        if buffer.num_occupied != occupied[buffer_id] or buffer.num_reserved != reserved[buffer_id]:
            raise LedgerError(
                f"2: buffer {buffer_id} counts {buffer.num_occupied}/{buffer.num_reserved}, "
                f"groups say {occupied[buffer_id]}/{reserved[buffer_id]}"
            )
        if buffer.num_occupied > sizes.ready_entries or buffer.num_occupied + buffer.num_reserved > sizes.num_slots:
            raise LedgerError(f"2: buffer {buffer_id} overfull: {buffer.counts()}")
        for prompt_id in buffer.occupied:
            if ledger._groups[prompt_id].buffer_id != buffer_id:
                raise LedgerError(f"3: buffer {buffer_id} lists prompt {prompt_id} that is elsewhere")
        for version, prompt_ids in buffer.reserved_by_version.items():
            for prompt_id in prompt_ids:
                group = ledger._groups[prompt_id]
                if group.buffer_id != buffer_id or group.version != version:
                    raise LedgerError(f"2: stale reservation index for prompt {prompt_id} in buffer {buffer_id}")
    missing = [b for b in occupied + reserved if b not in ledger._buffers]
    if missing:
        raise LedgerError(f"3: groups point at missing buffers {missing}")


def _check_indexes(ledger: StalenessLedger) -> None:
    indexed = {p: v for v, ids in ledger._live_by_version.items() for p in ids}
    live = {p: g.version for p, g in ledger._groups.items() if g.state != GroupState.OCCUPIED}
    if indexed != live:
        raise LedgerError(f"2: live index {indexed} != live groups {live}")
    dead = [v for v in ledger._live_by_version if ledger.is_version_dead(v)]
    if dead:
        raise LedgerError(f"stale groups of dead versions {dead} were not aborted")
