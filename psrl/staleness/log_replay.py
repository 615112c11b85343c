"""The staleness ledger re-derived from a run's log: what ``psrl replay --check ledger`` and a
restarted router both rebuild it from.

The router logs every call on its ledger (``ledger.op``) and every reservation (in its
``router.decision`` records); re-running them in log order on a fresh ledger reaches the router's
own state. Each router incarnation announces itself with a ``router.status`` first: a router that
started from nothing (a new run, or a resumed one, whose ledger begins at the checkpoint's version)
starts a fresh ledger at the status's ``next_buffer``; a router that rebuilt its ledger after a
crash (``recovered``) continues the one its predecessor left, which is exactly this replay's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus.messages import LedgerOp, RouterStatus, RoutingRecord
from bus.schema import Event
from psrl.routing.decision import RoutingDecision
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.oplog import describe_op, run_op
from psrl.staleness.types import LedgerSizes


def routing_decision(record: RoutingRecord) -> RoutingDecision:
    return msgspec.msgpack.decode(record.record, type=RoutingDecision)


class LedgerReplay:
    """The ledger as the router's logged calls leave it, one event at a time."""

    def __init__(self, sizes: LedgerSizes) -> None:
        self.sizes = sizes
        self.ledger: StalenessLedger | None = None
        self.router_incarnation: int | None = None

    def on_status(self, event: Event[Any]) -> None:
        """A new router incarnation: a fresh ledger, unless it continues its predecessor's."""
        status = event.message
        if not isinstance(status, RouterStatus) or event.envelope.incarnation == self.router_incarnation:
            return
        self.router_incarnation = event.envelope.incarnation
        if not (status.recovered and self.ledger is not None):
            self.ledger = StalenessLedger(self.sizes, next_buffer_id=status.next_buffer)

    def current(self) -> StalenessLedger:
        if self.ledger is None:
            self.ledger = StalenessLedger(self.sizes)
        return self.ledger

    def apply(self, event: Event[Any]) -> Any | None:
        """Re-run one logged ledger call; its outcome (None: a routing decision that reserved nothing)."""
        msg = event.message
        if isinstance(msg, LedgerOp):
            return describe_op(msg.op, self.run(msg))
        decision = routing_decision(msg)
        if decision.reserved_buffer is None or decision.inputs is None:
            return None
        request = decision.inputs.request
        try:
            return self.current().reserve(request.prompt_id, request.child_index, decision.version_tag,
                                          decision.instance_id or "")  # fmt: skip
        except Exception as exc:
            return f"error: {exc}"

    def run(self, op: LedgerOp) -> object:
        """Re-run one logged ``ledger.op``; its outcome as the ledger returns it."""
        return run_op(self.current(), op.op, op.prompt_id, op.child, op.reason)

    def observe(self, event: Event[Any]) -> object | None:
        """Follow any logged event: statuses start incarnations, ledger calls are re-run. Returns a
        ``ledger.op``'s outcome as the ledger returns it (what a restarted router reads), else None."""
        msg = event.message
        if isinstance(msg, RouterStatus):
            self.on_status(event)
        elif isinstance(msg, LedgerOp):
            return self.run(msg)
        elif isinstance(msg, RoutingRecord):
            self.apply(event)
        return None
