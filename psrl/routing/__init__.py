"""Routing: request queues, worker selection and the routing policies (pure decision code).

The router actor drives a ``RouterCore``; every decision it returns is a ``RoutingDecision``
that carries the inputs its selection read (see ``psrl.routing.replay``).
"""

from psrl.routing.core import DispatchResult, RouterCore
from psrl.routing.decision import DecisionInputs, LedgerAnswer, Reason, RoutingDecision
from psrl.routing.instance import CandidateState, InstanceSnapshot
from psrl.routing.ledger import LedgerQueries
from psrl.routing.offload import OffloadTierView
from psrl.routing.policies import make_policy
from psrl.routing.preemption import preempted_to_loop_back
from psrl.routing.queue import RequestQueue
from psrl.routing.request import UNVERSIONED, RoutingRequest
from psrl.routing.servable import ServableCounts, count_servable

__all__ = [
    "UNVERSIONED",
    "CandidateState",
    "DecisionInputs",
    "DispatchResult",
    "InstanceSnapshot",
    "LedgerAnswer",
    "LedgerQueries",
    "OffloadTierView",
    "Reason",
    "RequestQueue",
    "RouterCore",
    "RoutingDecision",
    "RoutingRequest",
    "ServableCounts",
    "count_servable",
    "make_policy",
    "preempted_to_loop_back",
]
