"""The run's promises, checked from its event log alone (no actor's own counters are trusted).

    lost          a prompt group reserved into a buffer the trainer consumed, yet neither in any
                  consumed batch nor given up by a documented rule (GroupDrop, Refill), once its
                  staleness window has passed (the last consumed buffer is at least its reserved
                  version + ``staleness``): a group still inside its window at the run's end may
                  occupy a later buffer (a complete group takes the earliest free slot, so after
                  refills a buffer can be filled by groups reserved after it)
    duplicated    a prompt group in two consumed batches (or twice in one), a buffer consumed twice
    staleness     a consumed trajectory older than ``eta`` versions at its buffer
    mixed         an instance loaded a version no PS had published (not verified on every shard),
                  a version was published before every shard stored it (half-written weights), or
                  a response's tokens go back to an older version / predate their trajectory's
    continuation  an interrupted request whose next result does not start with its tokens
    versions      the trainer's versions not consecutive (a restarted trainer renumbering)
    sessions      multi-turn sessions lost, a turn or environment step applied twice, or a finished
                  session's response not exactly its turns and answers (``session_invariants``)

Pure: it takes decoded events in log order, so the chaos harness, tests and replay share it.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bus.gaps import GapTracker
from bus.messages import (
    FinishReason,
    GenerateResult,
    GroupDrop,
    Refill,
    Reserve,
    ShardStored,
    TrainBatch,
    TrainerProgress,
    TrajectoryDone,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Event
from psrl.reliability.session_invariants import SessionFacts, SessionReport, check_sessions
from psrl.routing.trajectories import INTERRUPTIONS


@dataclass
class InvariantReport:
    """What the log proves. Every list names the offending ids (empty = the promise held)."""

    lost: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    buffers_consumed_twice: list[int] = field(default_factory=list)
    staleness_violations: list[int] = field(default_factory=list)
    unverified_loads: list[str] = field(default_factory=list)
    half_written: list[int] = field(default_factory=list)
    mixed_tokens: list[int] = field(default_factory=list)
    broken_continuations: list[int] = field(default_factory=list)
    version_jumps: list[str] = field(default_factory=list)
    num_checks: int = 0
    num_groups_consumed: int = 0
    num_buffers_consumed: int = 0
    num_continuations: int = 0
    num_missing_events: int = 0  # per-sender sequence gaps: events the log never got
    sessions: SessionReport = field(default_factory=SessionReport)

    @property
    def mixed_versions(self) -> int:
        return len(self.unverified_loads) + len(self.half_written) + len(self.mixed_tokens)

    @property
    def violations(self) -> dict[str, int]:
        return {
            "lost": len(self.lost),
            "duplicated": len(self.duplicated) + len(self.buffers_consumed_twice),
            "staleness": len(self.staleness_violations),
            "mixed_versions": self.mixed_versions,
            "continuations": len(self.broken_continuations),
            "versions": len(self.version_jumps),
            "sessions_lost": len(self.sessions.lost),
            "sessions_applied_twice": len(self.sessions.applied_twice),
            "sessions_broken": len(self.sessions.broken),
        }

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())


@dataclass
class _Facts:
    reserved: dict[int, int] = field(default_factory=dict)  # prompt id -> earliest reserved buffer
    newest_version: dict[int, int] = field(default_factory=dict)  # prompt id -> newest version reserved at
    given_up: set[int] = field(default_factory=set)
    batches: list[TrainBatch] = field(default_factory=list)
    trajectories: dict[int, TrajectoryDone] = field(default_factory=dict)
    results: dict[int, list[GenerateResult]] = field(default_factory=lambda: defaultdict(list))
    progress: list[TrainerProgress] = field(default_factory=list)
    stored: dict[int, dict[int, str]] = field(default_factory=dict)  # version -> shard -> digest
    published: list[WeightsPublished] = field(default_factory=list)
    loaded: list[WeightsLoaded] = field(default_factory=list)
    sessions: SessionFacts = field(default_factory=SessionFacts)


def check_invariants(events: Iterable[Event[Any]], staleness: int) -> InvariantReport:
    report = InvariantReport()
    facts = _Facts()
    gaps = GapTracker()
    for event in events:
        gaps.observe(event.envelope)
        _collect(event.message, facts)
        facts.sessions.observe(event.message)
    report.num_missing_events = gaps.num_missing
    _check_weights(facts, report)
    _check_groups(facts, staleness, report)
    _check_staleness(facts, staleness, report)
    _check_tokens(facts, report)
    _check_continuations(facts, report)
    _check_versions(facts, report)
    last_buffer = max((batch.buffer for batch in facts.batches), default=-1)
    report.sessions = check_sessions(facts.sessions, _settled(facts, staleness, last_buffer))
    report.num_checks += report.sessions.num_checks
    return report


def _check_weights(facts: _Facts, report: InvariantReport) -> None:
    """Published = every shard stored that exact content; loaded = published. Events of different
    actors reach the log in any order, so these are checked over the whole log, not its order."""
    for published in facts.published:
        report.num_checks += 1
        digests = facts.stored.get(published.version, {})
        whole = all(digests.get(shard) == published.manifest_digest for shard in range(published.num_shards))
        if not whole:
            report.half_written.append(published.version)
    versions = {0} | {p.version for p in facts.published}  # version 0: the checkpoint every instance starts from
    for loaded in facts.loaded:
        report.num_checks += 1
        if loaded.version not in versions:
            report.unverified_loads.append(f"{loaded.instance}@{loaded.version}")


def _collect(msg: Any, facts: _Facts) -> None:
    if isinstance(msg, ShardStored):
        facts.stored.setdefault(msg.version, {})[msg.shard] = msg.digest
    elif isinstance(msg, WeightsPublished):
        facts.published.append(msg)
    elif isinstance(msg, WeightsLoaded):
        facts.loaded.append(msg)
    elif isinstance(msg, Reserve):
        facts.reserved[msg.prompt_id] = min(msg.buffer, facts.reserved.get(msg.prompt_id, msg.buffer))
        facts.newest_version[msg.prompt_id] = max(msg.version, facts.newest_version.get(msg.prompt_id, msg.version))
    elif isinstance(msg, GroupDrop):
        facts.given_up.add(msg.prompt_id)
    elif isinstance(msg, Refill):
        facts.given_up.update(msg.prompt_ids)
    elif isinstance(msg, TrainBatch):
        facts.batches.append(msg)
    elif isinstance(msg, TrajectoryDone):
        facts.trajectories[msg.request_id] = msg
    elif isinstance(msg, GenerateResult):
        facts.results[msg.request_id].append(msg)
    elif isinstance(msg, TrainerProgress):
        facts.progress.append(msg)


def _settled(facts: _Facts, staleness: int, last_buffer: int) -> set[int]:
    """The groups the run is done with: consumed, or reserved into a consumed buffer with their
    staleness window passed (they can no longer be trained). A given-up group is not: its other
    sessions may still run to their (wasted) end when the run stops."""
    consumed = {p for batch in facts.batches for p in batch.prompt_ids}
    closed = {
        p
        for p, buffer in facts.reserved.items()
        if buffer <= last_buffer and facts.newest_version[p] + staleness <= last_buffer
    }
    return consumed | closed


def _check_groups(facts: _Facts, staleness: int, report: InvariantReport) -> None:
    consumed = Counter(p for batch in facts.batches for p in batch.prompt_ids)
    buffers = Counter(batch.buffer for batch in facts.batches)
    report.num_groups_consumed = len(consumed)
    report.num_buffers_consumed = len(buffers)
    report.duplicated = sorted(p for p, n in consumed.items() if n > 1)
    report.buffers_consumed_twice = sorted(b for b, n in buffers.items() if n > 1)
    last_buffer = max(buffers, default=-1)
    for prompt_id, buffer in facts.reserved.items():
        report.num_checks += 1
        window_passed = facts.newest_version[prompt_id] + staleness <= last_buffer
        if buffer <= last_buffer and window_passed and prompt_id not in consumed and prompt_id not in facts.given_up:
            report.lost.append(prompt_id)
    report.lost.sort()


def _check_staleness(facts: _Facts, staleness: int, report: InvariantReport) -> None:
    for batch in facts.batches:
        report.num_checks += 1
        if batch.min_version >= 0 and not 0 <= batch.buffer - batch.min_version <= staleness:
            report.staleness_violations.append(batch.buffer)


def _check_tokens(facts: _Facts, report: InvariantReport) -> None:
    """Consumed responses: token versions never go back and none predates the trajectory's version."""
    consumed = {p for batch in facts.batches for p in batch.prompt_ids}
    for done in facts.trajectories.values():
        if done.prompt_id not in consumed or done.finish_reason in (FinishReason.ABORT, FinishReason.ERROR):
            continue
        report.num_checks += 1
        versions = np.asarray(done.versions)
        if len(versions) and (int(versions.min()) < done.v_traj or bool(np.any(np.diff(versions) < 0))):
            report.mixed_tokens.append(done.request_id)


def _check_continuations(facts: _Facts, report: InvariantReport) -> None:
    for request_id, results in facts.results.items():
        for earlier, later in itertools.pairwise(results):
            if earlier.finish_reason != FinishReason.ABORT or earlier.error not in INTERRUPTIONS:
                continue
            report.num_continuations += 1
            report.num_checks += 1
            prefix = np.asarray(earlier.token_ids).tolist()
            if np.asarray(later.token_ids).tolist()[: len(prefix)] != prefix:
                report.broken_continuations.append(request_id)


def _check_versions(facts: _Facts, report: InvariantReport) -> None:
    """Each trainer step produces the next version: one numbering across restarts."""
    versions = sorted({p.version for p in facts.progress})
    for before, after in itertools.pairwise(versions):
        report.num_checks += 1
        if after != before + 1:
            report.version_jumps.append(f"{before}->{after}")
