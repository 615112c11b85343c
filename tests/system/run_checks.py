"""Checks of a finished run, read from its event log (the same facts `psrl replay` sees)."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bus.eventlog.reader import EventLogReader
from bus.messages import FinishReason, GenerateResult, LedgerOp, RoutingRecord
from psrl.routing.decision import RoutingDecision
from psrl.routing.trajectories import INTERRUPTIONS


@dataclass
class RunFacts:
    events: list[Any]
    routed: dict[int, list[tuple[str, int, float]]] = field(default_factory=lambda: defaultdict(list))
    results: dict[int, list[GenerateResult]] = field(default_factory=lambda: defaultdict(list))
    result_times: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    consumed: list[tuple[int, list[int], dict[int, int], int]] = field(default_factory=list)
    v_traj: dict[int, int] = field(default_factory=dict)


def read_run(events_dir: Any) -> RunFacts:
    events = [e.event for e in EventLogReader(events_dir).events()]
    facts = RunFacts(events)
    for event in events:
        msg, when = event.message, event.envelope.wall_ns / 1e9
        if isinstance(msg, RoutingRecord):
            decision = msgspec.msgpack.decode(msg.record, type=RoutingDecision)
            facts.routed[msg.request_id].append((msg.instance, decision.version_tag, when))
            facts.v_traj.setdefault(msg.request_id, decision.version_tag)
        elif isinstance(msg, GenerateResult):
            facts.results[msg.request_id].append(msg)
            facts.result_times[msg.request_id].append(when)
        elif isinstance(msg, LedgerOp) and msg.op == "consume" and not msg.outcome.startswith("error"):
            groups = [int(x) for x in re.search(r"groups=\[([^\]]*)\]", msg.outcome).group(1).split(",") if x.strip()]
            hist = dict(tuple(map(int, p)) for p in re.findall(r"\((\d+), (\d+)\)", msg.outcome))
            violations = int(re.search(r"violations=(\d+)", msg.outcome).group(1))
            facts.consumed.append((msg.prompt_id, groups, hist, violations))
    return facts


def finished(result: GenerateResult) -> bool:
    """Stopped, hit its length, or was truncated by the proactive filter (its output is its response)."""
    truncated = result.finish_reason == FinishReason.ABORT and result.error == "truncate"
    return truncated or result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def check_staleness_bound(facts: RunFacts, staleness: int) -> None:
    assert facts.consumed, "no buffer was consumed"
    for buffer, _, histogram, violations in facts.consumed:
        assert violations == 0, f"buffer {buffer}: {violations} staleness violations"
        assert all(0 <= k <= staleness for k in histogram), f"buffer {buffer}: staleness {histogram}"


def check_consumed_groups(facts: RunFacts, n: int, per_prompt: int, staleness: int) -> None:
    """Every consumed group has its N finished trajectories, each with a version per token in bounds."""
    for buffer, groups, _, _ in facts.consumed:
        for prompt_id in groups:
            done = [r for child in range(per_prompt)
                    for r in facts.results.get(prompt_id * per_prompt + child, []) if finished(r)]  # fmt: skip
            assert len(done) >= n, f"group {prompt_id} in buffer {buffer} has {len(done)} finished trajectories"
            for result in done:
                v = facts.v_traj[result.request_id]
                assert len(result.versions) == len(result.token_ids) > 0
                assert int(result.versions.min()) >= v, "a token predates the trajectory's version"
                assert v <= buffer <= v + staleness


def check_continuations(facts: RunFacts) -> int:
    """Each interrupted result is continued: the next result of the request starts with its tokens."""
    num = 0
    for rid, results in facts.results.items():
        for earlier, later in itertools.pairwise(results):
            if earlier.finish_reason == FinishReason.ABORT and earlier.error in INTERRUPTIONS:
                num += 1
                prefix = earlier.token_ids.tolist()
                assert later.token_ids.tolist()[: len(prefix)] == prefix, f"request {rid} lost its partial output"
    return num
