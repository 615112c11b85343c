"""Ledger calls as loggable records: the router logs each call, a replay re-runs them in order.

`describe_*` turn an outcome into the text a `ledger.op` event carries; `run_op` re-runs one logged
call on a ledger and returns the outcome itself (a restarted router reads what each finish decided),
and `describe_op` gives its text, so a replay compares strings.
"""

from __future__ import annotations

from typing import Any

from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.proactive import FilterMethod, RetryOutcome, TruncateOutcome, apply_proactive_filter
from psrl.staleness.types import AbortReason, ConsumedBuffer, FinishOutcome, GroupAborted, OccupyOutcome


def describe_finish(outcome: FinishOutcome) -> str:
    return f"{outcome.verdict.name} winners={list(outcome.winners)} surplus={[r.child for r in outcome.surplus]}"


def describe_occupy(outcome: OccupyOutcome) -> str:
    aborted = sorted((a.prompt_id, a.reason.name) for a in outcome.aborted)
    return f"buffer={outcome.buffer_id} ready={outcome.is_buffer_ready} aborted={aborted}"


def describe_abort(aborted: GroupAborted | None) -> str:
    return (
        "none" if aborted is None else f"{aborted.reason.name} children={[r.child for r in aborted.children_to_abort]}"
    )


def describe_consume(consumed: ConsumedBuffer) -> str:
    groups = [g.prompt_id for g in consumed.groups]
    histogram = sorted(consumed.staleness_histogram.items())
    return f"groups={groups} histogram={histogram} violations={consumed.num_bound_violations}"


def describe_proactive(outcome: RetryOutcome | TruncateOutcome | None) -> str:
    if outcome is None:
        return "none"
    if isinstance(outcome, RetryOutcome):
        aborted = sorted((a.prompt_id, a.reason.name) for a in outcome.aborted)
        moved = list(outcome.moved)
        return f"retry buffer={outcome.buffer_id} moved={moved} aborted={aborted} fresh={outcome.num_fresh_prompts}"
    groups = [(g.prompt_id, list(g.winners)) for g in outcome.groups]
    return f"truncate buffer={outcome.buffer_id} groups={groups} ready={outcome.is_buffer_ready}"


def run_op(ledger: StalenessLedger, op: str, prompt_id: int, child: int, reason: str) -> object:
    """Re-run one logged call; returns its outcome as the ledger returns it (an exception's text if it raises)."""
    try:
        if op == "finish":
            return ledger.finish_child(prompt_id, child)
        if op == "occupy":
            return ledger.occupy(prompt_id)
        if op == "abort_child":
            return ledger.abort_child(prompt_id, child, AbortReason[reason])
        if op == "abort_group":
            return ledger.abort_group(prompt_id, AbortReason[reason])
        if op == "consume":
            return ledger.consume(prompt_id)
        if op == "proactive":
            method: FilterMethod = "retry" if reason == "retry" else "truncate"
            return apply_proactive_filter(ledger, method, child)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return f"error: unknown op {op!r}"


_DESCRIBE: dict[str, Any] = {
    "finish": describe_finish,
    "occupy": describe_occupy,
    "abort_child": describe_abort,
    "abort_group": describe_abort,
    "consume": describe_consume,
    "proactive": describe_proactive,
}


def describe_op(op: str, outcome: object) -> str:
    """The text a ``ledger.op`` of ``op`` carries for ``outcome`` (``run_op``'s)."""
    return outcome if isinstance(outcome, str) else str(_DESCRIBE[op](outcome))
