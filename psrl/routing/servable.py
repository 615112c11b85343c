"""Router facts for the coordinator: how much queued work each instance version could still take.

For a version ``v`` a queued request is servable when its V_traj <= v and either it already
holds a reservation (a continuation), or the ledger lets its prompt group join an existing
entry at ``v`` ("without new entry"), or the ledger can open a new entry for it at ``v``.
``check_req_before_sync`` postpones a sync while the first two kinds exist; hypothesis_test and
migration use all three.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from psrl.routing.ledger import LedgerQueries
from psrl.routing.request import RoutingRequest


class ServableCounts(msgspec.Struct, frozen=True, gc=False, array_like=True):
    version: int
    without_new_entry: int  # continuations and siblings joining an existing group entry
    with_new_entry: int  # requests that would open a new staleness entry at this version

    @property
    def total(self) -> int:
        return self.without_new_entry + self.with_new_entry


def count_servable(
    requests: Iterable[RoutingRequest], ledger: LedgerQueries, versions: Iterable[int]
) -> dict[int, ServableCounts]:
    """Servable queued requests per version in ``versions`` (ledger answers cached per prompt)."""
    wanted = sorted(set(versions))
    without = dict.fromkeys(wanted, 0)
    with_new = dict.fromkeys(wanted, 0)
    cache: dict[tuple[int, int], int] = {}  # (prompt, version) -> 0 none, 1 join, 2 new entry
    for request in requests:
        for version in wanted:
            if request.version_tag > version:
                continue
            if not request.is_unversioned:
                without[version] += 1
                continue
            key = (request.prompt_id, version)
            kind = cache.get(key)
            if kind is None:
                kind = _kind(ledger, request.prompt_id, version)
                cache[key] = kind
            if kind == 1:
                without[version] += 1
            elif kind == 2:
                with_new[version] += 1
    return {v: ServableCounts(v, without[v], with_new[v]) for v in wanted}


def _kind(ledger: LedgerQueries, prompt_id: int, version: int) -> int:
    if ledger.can_reserve_without_new_entry(prompt_id, version):
        return 1
    return 2 if ledger.can_reserve(prompt_id, version) else 0
