"""CoordinatorFlow in process: failed trajectories counted per step, failing rewards ending the run."""

from __future__ import annotations

import numpy as np
import pytest

from bus.messages import BufferReady, FinishReason, Metrics, Occupy, RunFinished, TrajectoryDone
from psrl.config import load_config
from psrl.flows.coordinator import CoordinatorFlow
from tests.flows.flow_helpers import FixedPrompts, done, published
from tests.flows.test_coordinator_flow import SMALL, N, _complete


class FailingRewards(FixedPrompts):
    """Every reward call of a step failed (what the real scorer reports when the function raises)."""

    def take_metrics(self) -> dict[str, float]:
        return {"reward/num_errors": 4.0, "reward/num_scored": 0.0}

    def take_first_error(self) -> str:
        return "ValueError: reward service down"


def hand_over(flow: CoordinatorFlow, buffer: int, now: float) -> list:
    """Groups 2*buffer and 2*buffer+1 finish, occupy ``buffer`` and fill it."""
    prompt_ids = [2 * buffer, 2 * buffer + 1]
    for slot, prompt_id in enumerate(prompt_ids):
        _complete(flow, prompt_id)
        flow.handle(Occupy(prompt_id=prompt_id, version=0, from_buffer=buffer, buffer=buffer, slot=slot), now)
    return flow.handle(BufferReady(buffer=buffer, prompt_ids=prompt_ids), now)


def failed(request_id: int, error: str) -> TrajectoryDone:
    empty = np.zeros(0, np.int32)
    return TrajectoryDone(request_id=request_id, prompt_id=request_id // N, v_traj=0, token_ids=empty,
                          logprobs=np.zeros(0, np.float32), versions=empty, finish_reason=FinishReason.ERROR,
                          instance="rollout-0", error=error)  # fmt: skip


def test_failed_sessions_and_generations_are_counted_with_their_first_error() -> None:
    prompts = FixedPrompts()
    flow = CoordinatorFlow(load_config("demo", SMALL), prompts, prompts)
    flow.start(0.0)
    flow.handle(failed(100, "session failed: ValueError: the environment broke"), 0.5)
    flow.handle(failed(101, "session failed: KeyError: 'tool'"), 0.6)
    flow.handle(failed(102, "instance rollout-1 gone"), 0.7)
    [metrics] = published(hand_over(flow, 0, 1.0), Metrics)
    assert (metrics.values["session/num_failed"], metrics.values["generation/num_failed"]) == (2.0, 1.0)
    assert metrics.notes == {"session/first_error": "ValueError: the environment broke",
                             "generation/first_error": "instance rollout-1 gone"}  # fmt: skip


def test_the_generation_rate_counts_finished_trajectories_not_the_buffer() -> None:
    prompts = FixedPrompts()
    flow = CoordinatorFlow(load_config("demo", SMALL), prompts, prompts)
    flow.start(0.0)
    for request_id in range(8):  # both buffers' groups finish within the first second
        flow.handle(done(request_id, N, num_tokens=8), 0.5)
    first = published(hand_over(flow, 0, 1.0), Metrics)[0].values["throughput/trajectories_per_s"]
    second = published(hand_over(flow, 1, 1.001), Metrics)[0].values["throughput/trajectories_per_s"]
    # 8 finished in about a second, for both: not 4 per millisecond for the buffer handed over 1 ms later
    assert first == pytest.approx(8, rel=0.01) and second == pytest.approx(8, rel=0.01)


def test_failing_rewards_end_the_run_after_the_patience() -> None:
    prompts = FailingRewards()
    config = load_config("demo", [*SMALL, "reward.error_patience=2"])
    flow = CoordinatorFlow(config, prompts, prompts)
    flow.start(0.0)
    assert published(hand_over(flow, 0, 1.0), RunFinished) == []
    [finished] = published(hand_over(flow, 1, 2.0), RunFinished)
    assert not finished.success and "2 steps in a row" in finished.reason
    assert "ValueError: reward service down" in finished.reason and flow.is_finished
