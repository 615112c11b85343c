"""A response the proactive filter truncates is TRUNCATED from the router to the trainer's metrics."""

from __future__ import annotations

import msgspec
import numpy as np

from bus.messages import BufferReady, FinishReason, GroupFinished, Occupy, TrainData
from psrl.config import load_config
from psrl.flows.coordinator import CoordinatorFlow
from psrl.flows.train_data import trajectories_from
from psrl.trainer.metrics import buffer_metrics
from tests.flows.flow_helpers import FixedPrompts, done, sent

SMALL = ["psrl.staleness_buffer_entries=2", "psrl.rollout_n=2", "psrl.staleness=0", "actor.ppo_mini_batch_size=2"]


def test_truncated_responses_are_trained_and_counted_in_truncated_frac() -> None:
    prompts = FixedPrompts()
    flow = CoordinatorFlow(load_config("demo", SMALL), prompts, prompts)
    flow.start(0.0)
    reasons = [FinishReason.STOP, FinishReason.TRUNCATED, FinishReason.LENGTH, FinishReason.TRUNCATED]
    for request_id, reason in enumerate(reasons):
        flow.handle(msgspec.structs.replace(done(request_id, 2, num_tokens=4 + request_id), finish_reason=reason), 1.0)
    flow.handle(GroupFinished(prompt_id=0, request_ids=[0, 1]), 1.0)  # scored and kept, as any other
    flow.handle(GroupFinished(prompt_id=1, request_ids=[2, 3], occupied_buffer=0), 1.0)  # truncated: occupied
    flow.handle(Occupy(prompt_id=0, version=0, from_buffer=0, buffer=0, slot=0), 1.0)
    flow.handle(Occupy(prompt_id=1, version=0, from_buffer=0, buffer=0, slot=1), 1.0)
    [data] = sent(flow.handle(BufferReady(buffer=0, prompt_ids=[0, 1]), 2.0), TrainData)
    assert [FinishReason(r) for r in data.finish_reasons] == reasons
    trajectories = trajectories_from(data, 2)
    assert [t.finish_reason for t in trajectories] == reasons
    # the trainer's arrays are views of the message's, not per-token copies
    assert all(np.shares_memory(t.response_token_ids, data.response_token_ids) for t in trajectories)
    assert all(np.shares_memory(t.rollout_log_probs, data.response_logprobs) for t in trajectories)
    metrics = buffer_metrics(0, trajectories, staleness=0)
    assert metrics["response_length/truncated_frac"] == 0.5
    assert metrics["response_length/clip_frac"] == 0.25
