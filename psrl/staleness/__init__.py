"""Staleness control: the Reserve / Occupy / Consume ledger, the proactive filter and the dispatch throttle.

Pure decision code (no I/O, no clock, no randomness); the router process owns the ledger.
"""

from psrl.staleness.invariants import check_invariants
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.proactive import (
    RetryOutcome,
    TruncatedGroup,
    TruncateOutcome,
    apply_proactive_filter,
    proactive_retry,
    proactive_truncate,
)
from psrl.staleness.throttle import dispatch_allowance, required_ps_version
from psrl.staleness.types import (
    AbortReason,
    BufferCounts,
    BufferStatus,
    ChildRef,
    ConsumedBuffer,
    ConsumedGroup,
    FinishOutcome,
    FinishVerdict,
    GroupAborted,
    GroupState,
    LedgerCounts,
    LedgerError,
    LedgerSizes,
    OccupyOutcome,
    ReservationMove,
    ReserveRefusedError,
)

__all__ = [
    "AbortReason",
    "BufferCounts",
    "BufferStatus",
    "ChildRef",
    "ConsumedBuffer",
    "ConsumedGroup",
    "FinishOutcome",
    "FinishVerdict",
    "GroupAborted",
    "GroupState",
    "LedgerCounts",
    "LedgerError",
    "LedgerSizes",
    "OccupyOutcome",
    "ReservationMove",
    "ReserveRefusedError",
    "RetryOutcome",
    "StalenessLedger",
    "TruncateOutcome",
    "TruncatedGroup",
    "apply_proactive_filter",
    "check_invariants",
    "dispatch_allowance",
    "proactive_retry",
    "proactive_truncate",
    "required_ps_version",
]
