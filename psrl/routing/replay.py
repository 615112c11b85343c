"""Re-derive routing decisions from their recorded inputs.

``replay_decision`` re-runs worker selection and the policy on one decision's
``DecisionInputs``; ``check_decisions`` does it for a run's decisions and reports agreement.
With the run's own settings agreement must be total; with other settings (a what-if) the
mismatches are the decisions those settings would have changed. Selection is re-run on the
inputs as recorded, so a what-if shows each decision's immediate change, not the run that
would have followed from it (for that, feed the recorded events to a fresh ``RouterCore``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from psrl.routing.decision import RoutingDecision
from psrl.routing.policies.base import RoutingPolicy
from psrl.routing.selector import SelectionSettings, select


@dataclass(frozen=True, slots=True)
class Replayed:
    instance_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Mismatch:
    seq: int
    request_id: int
    recorded: Replayed
    replayed: Replayed


@dataclass
class DecisionAgreement:
    num_checked: int = 0
    num_agreed: int = 0
    num_without_inputs: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.num_agreed / self.num_checked if self.num_checked else 1.0


def replay_decision(decision: RoutingDecision, settings: SelectionSettings, policy: RoutingPolicy) -> Replayed:
    if decision.inputs is None:
        raise ValueError(f"decision {decision.seq} was recorded without its inputs")
    selection = select(decision.inputs, settings, policy)
    if selection.choice is None:
        return Replayed(None, selection.reason)
    return Replayed(decision.inputs.candidates[selection.choice.index].instance_id, selection.reason)


def check_decisions(
    decisions: Iterable[RoutingDecision], settings: SelectionSettings, policy: RoutingPolicy
) -> DecisionAgreement:
    report = DecisionAgreement()
    for decision in decisions:
        if decision.inputs is None:
            report.num_without_inputs += 1
            continue
        report.num_checked += 1
        recorded = Replayed(decision.instance_id, decision.reason)
        replayed = replay_decision(decision, settings, policy)
        if replayed == recorded:
            report.num_agreed += 1
        else:
            report.mismatches.append(Mismatch(decision.seq, decision.request_id, recorded, replayed))
    return report
