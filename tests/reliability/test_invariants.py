"""The run invariants checked from an event log: each promise, kept and broken."""

from __future__ import annotations

from typing import Any

import numpy as np

from bus.messages import (
    EnvStepDone,
    FinishReason,
    GenerateResult,
    GroupDrop,
    Reserve,
    SessionEnd,
    ShardStored,
    TrainBatch,
    TrainerProgress,
    TrajectoryDone,
    TurnDone,
    TurnNext,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Envelope, Event, Message
from psrl.reliability.invariants import check_invariants

STALENESS = 1


class Log:
    """Builds a log in order, one sequence per sender."""

    def __init__(self) -> None:
        self.events: list[Event[Any]] = []
        self.seqs: dict[str, int] = {}

    def add(self, sender: str, message: Message) -> Log:
        seq = self.seqs[sender] = self.seqs.get(sender, 0) + 1
        envelope = Envelope(type(message).KIND, 1, sender, 0, seq, seq, seq)
        self.events.append(Event(envelope, message))
        return self


def tokens(versions: list[int]) -> dict[str, Any]:
    n = len(versions)
    return {
        "token_ids": np.arange(n, dtype=np.int32),
        "logprobs": np.zeros(n, np.float32),
        "versions": np.asarray(versions, np.int32),
    }


def healthy() -> Log:
    """Two groups into buffer 0, one given up; version 1 stored on both shards, published, loaded."""
    log = Log()
    for prompt_id in (0, 1, 2):
        log.add("router", Reserve(prompt_id, 0, 1, -1))
    log.add("router", GroupDrop(2, "no_room"))
    for request_id, prompt_id in ((0, 0), (1, 1)):
        done = TrajectoryDone(
            request_id, prompt_id, 0, **tokens([0, 0, 1]), finish_reason=FinishReason.STOP, instance="rollout-0"
        )
        log.add("router", done)
    log.add("coordinator", TrainBatch(1, 0, [0, 1], 2, 6, 0))
    log.add("trainer-0", TrainerProgress(1, 1, 2))
    log.add("ps-1", ShardStored(1, 1, 3, 10, "d1"))
    log.add("ps-0", WeightsPublished(1, "d1", 2))  # before shard 0's own record: the log order is not causal
    log.add("ps-0", ShardStored(1, 0, 3, 10, "d1"))
    log.add("rollout-0", WeightsLoaded("rollout-0", 1))
    log.add("trainer-0", TrainerProgress(2, 2, 2))
    return log


def test_a_healthy_log_keeps_every_promise() -> None:
    report = check_invariants(healthy().events, STALENESS)
    assert report.ok, report.violations
    assert report.num_groups_consumed == 2 and report.num_buffers_consumed == 1
    assert report.num_checks > 5


def test_a_group_reserved_into_a_consumed_buffer_but_never_trained_is_lost() -> None:
    log = healthy().add("router", Reserve(7, 0, 0, -1)).add("coordinator", TrainBatch(2, 1, [9], 1, 3, 0))
    assert check_invariants(log.events, STALENESS).lost == [7]


def test_a_group_inside_its_staleness_window_at_the_end_may_still_occupy_a_later_buffer() -> None:
    log = healthy().add("router", Reserve(7, 0, 0, -1))  # buffer 0 went to other groups; 7 may take buffer 1
    assert check_invariants(log.events, STALENESS).ok


def test_a_group_reserved_into_a_buffer_not_consumed_yet_is_in_flight_not_lost() -> None:
    log = healthy().add("router", Reserve(8, 1, 2, -1))
    assert check_invariants(log.events, STALENESS).ok


def test_a_group_or_buffer_consumed_twice_is_duplicated() -> None:
    log = healthy().add("coordinator", TrainBatch(2, 1, [1, 5], 2, 6, 1))
    report = check_invariants(log.events, STALENESS)
    assert report.duplicated == [1]
    log = healthy().add("coordinator", TrainBatch(2, 0, [9], 1, 3, 0))
    assert check_invariants(log.events, STALENESS).buffers_consumed_twice == [0]


def test_a_batch_older_than_the_bound_violates_staleness() -> None:
    log = healthy().add("coordinator", TrainBatch(4, 3, [9], 1, 3, 1))
    assert check_invariants(log.events, STALENESS).staleness_violations == [3]


def test_weights_published_without_every_shard_are_half_written() -> None:
    log = healthy().add("ps-0", ShardStored(2, 0, 3, 10, "d2")).add("ps-0", WeightsPublished(2, "d2", 2))
    assert check_invariants(log.events, STALENESS).half_written == [2]
    log = healthy().add("ps-1", ShardStored(2, 1, 3, 10, "other")).add("ps-0", ShardStored(2, 0, 3, 10, "d2"))
    log.add("ps-0", WeightsPublished(2, "d2", 2))
    assert check_invariants(log.events, STALENESS).half_written == [2], "a shard holding other content"


def test_loading_a_version_nobody_published_is_unverified() -> None:
    log = healthy().add("rollout-1", WeightsLoaded("rollout-1", 5))
    assert check_invariants(log.events, STALENESS).unverified_loads == ["rollout-1@5"]


def test_tokens_going_back_a_version_are_mixed() -> None:
    log = healthy()
    log.add("router", TrajectoryDone(3, 1, 0, **tokens([1, 0]), finish_reason=FinishReason.STOP, instance="rollout-0"))
    assert check_invariants(log.events, STALENESS).mixed_tokens == [3]


def test_a_continuation_that_drops_its_tokens_is_broken() -> None:
    interrupted = GenerateResult(4, 0, **tokens([0, 0]), finish_reason=FinishReason.ABORT, instance="i", error="sync")
    good = GenerateResult(4, 0, **tokens([0, 0, 1]), finish_reason=FinishReason.STOP, instance="i")
    report = check_invariants(healthy().add("rollout-0", interrupted).add("rollout-0", good).events, STALENESS)
    assert report.ok and report.num_continuations == 1
    restarted = GenerateResult(4, 0, np.asarray([5], np.int32), np.zeros(1, np.float32), np.ones(1, np.int32),
                               FinishReason.STOP, "i")  # fmt: skip
    report = check_invariants(healthy().add("rollout-0", interrupted).add("rollout-0", restarted).events, STALENESS)
    assert report.broken_continuations == [4]


def test_a_trainer_that_skips_a_version_breaks_the_numbering() -> None:
    log = healthy().add("trainer-0", TrainerProgress(3, 4, 2))
    assert check_invariants(log.events, STALENESS).version_jumps == ["2->4"]


def session_log(*, response: list[int] | None = None, answers: int = 1, nexts: int = 1, end: bool = True) -> Log:
    """Session 0 of group 0: turn [1, 2], the environment answers [5], turn [3], done; group 0 trained."""
    log = Log()
    log.add("router", Reserve(0, 0, 0, -1))
    log.add("router.link", TurnDone(0, 0, "rollout-0", 0, np.asarray([1, 2], np.int32), 12, FinishReason.STOP))
    for _ in range(answers):
        log.add("session", EnvStepDone(0, 0, np.asarray([5], np.int32)))
    for _ in range(nexts):
        log.add("session-router.link", TurnNext(0, 1, np.asarray([5], np.int32), 4))
    log.add("router.link", TurnDone(0, 0, "rollout-0", 1, np.asarray([3], np.int32), 14, FinishReason.STOP))
    log.add("session", EnvStepDone(0, 1, np.zeros(0, np.int32), reward=1.0, done=True))
    if end:
        log.add("session-router.link", SessionEnd(0, 1.0, 1.0, 2))
        ids = np.asarray(response if response is not None else [1, 2, 5, 3], np.int32)
        done = TrajectoryDone(0, 0, 0, ids, np.zeros(len(ids), np.float32), np.zeros(len(ids), np.int32),
                              FinishReason.STOP, "rollout-0", num_turns=2)  # fmt: skip
        log.add("router.link", done)
    log.add("coordinator", TrainBatch(1, 0, [0], 1, 4, 0))
    return log


def test_a_session_finished_from_exactly_its_turns_and_answers_keeps_every_promise() -> None:
    report = check_invariants(session_log().events, STALENESS)
    assert report.ok, report.violations
    assert (report.sessions.num_sessions, report.sessions.num_finished) == (1, 1)


def test_a_session_that_never_ended_while_its_group_was_trained_is_lost() -> None:
    assert check_invariants(session_log(end=False).events, STALENESS).sessions.lost == [0]


def test_a_turn_or_an_environment_step_applied_twice_is_caught() -> None:
    assert check_invariants(session_log(nexts=2).events, STALENESS).ok  # the same answer sent again
    log = session_log().add("session-router.link", TurnNext(0, 1, np.asarray([6], np.int32), 4))
    assert check_invariants(log.events, STALENESS).violations["sessions_applied_twice"] == 1
    assert check_invariants(session_log(answers=2).events, STALENESS).violations["sessions_applied_twice"] == 1


def test_a_session_that_did_not_continue_from_exactly_its_tokens_is_broken() -> None:
    assert check_invariants(session_log(response=[1, 2, 3]).events, STALENESS).sessions.broken == [0]
    assert check_invariants(session_log(response=[1, 2, 5, 3, 3]).events, STALENESS).sessions.broken == [0]


def test_a_session_failed_by_its_environment_is_counted_not_lost() -> None:
    log = session_log(end=False)
    log.add("session-router.link", SessionEnd(0, 0.0, 0.0, 2, error="environment step timed out after 30 s"))
    report = check_invariants(log.events, STALENESS)
    assert report.ok and dict(report.sessions.failed) == {"environment step timed out": 1}
