"""Sampling parameters the coordinator gives each request of the configured task."""

from __future__ import annotations

from psrl.config import load_config
from psrl.coordination.lengths import forced_length
from psrl.flows.prompts import TaskPrompts


def test_a_forced_length_is_generated_from_the_unmasked_policy() -> None:
    config = load_config("demo", ["task.response_lengths=long_tail", "task.long_tail_median=40"])
    params = TaskPrompts(config).sampling(request_id=7, num_prompt_tokens=12)
    length = forced_length(config.task, 7)
    assert params.max_tokens == params.min_tokens == length
    # nothing can end it early, and nothing is masked: the rollout samples the policy the trainer scores
    assert params.ignore_eos and not params.stop_token_ids


def test_natural_lengths_stop_at_end_of_sequence() -> None:
    prompts = TaskPrompts(load_config("demo", []))
    params = prompts.sampling(request_id=7, num_prompt_tokens=12)
    assert not params.ignore_eos and params.min_tokens == 0
    assert list(params.stop_token_ids) == prompts.stop_token_ids != []
