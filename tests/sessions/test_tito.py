"""Token in, token out: a multi-turn session reaches the trainer exactly as the engine generated it
and the environment replied, with a loss mask that trains only the generated tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bus.messages import EnvStepDone, GenerateResult, TrainData, TurnNext
from psrl.config import load_config
from psrl.flows.driver import InProcessRun
from psrl.flows.effects import Effect, Send
from psrl.flows.train_data import trajectories_from
from psrl.rl.batch import Sample, collate

SESSIONS = [
    "env.enable=true",
    "task.name=digit_chain",
    "env.max_turns=3",
    "env.max_turn_tokens=8",
    "psrl.staleness_buffer_entries=4",
    "psrl.rollout_n=4",
    "actor.ppo_mini_batch_size=4",
    "trainer.total_steps=2",
]


def _run(overrides: list[str]) -> tuple[InProcessRun, list[tuple[str, Any]]]:
    run = InProcessRun(load_config("demo", [*SESSIONS, *overrides]))
    seen: list[tuple[str, Any]] = []

    def tap(sender: str, effect: Effect, now: float) -> None:
        if isinstance(effect, Send):
            seen.append((effect.to, effect.message))

    run.bus.tap = tap
    original = run.env.take  # type: ignore[union-attr]

    def take() -> list[EnvStepDone]:
        replies = original()
        seen.extend(("session", r) for r in replies)
        return replies

    run.env.take = take  # type: ignore[method-assign,union-attr]
    record = run.run()
    assert record.finished is not None and record.finished.success
    return run, seen


def _expected(seen: list[tuple[str, Any]], request_id: int) -> tuple[list[int], list[float], list[int]]:
    """The session's response rebuilt from what the engines returned (each turn's final result) and
    what the environment answered, in order."""
    tokens: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    turn_tokens: list[int] = []
    turn_logprobs: list[float] = []
    for _, message in seen:
        if getattr(message, "request_id", None) != request_id:
            continue
        if isinstance(message, GenerateResult) and message.finish_reason.name in ("STOP", "LENGTH"):
            turn_tokens, turn_logprobs = message.token_ids.tolist(), message.logprobs.tolist()
        elif isinstance(message, TurnNext):
            tokens += turn_tokens + message.observation_token_ids.tolist()
            logprobs += turn_logprobs + [0.0] * len(message.observation_token_ids)
            mask += [1] * len(turn_tokens) + [0] * len(message.observation_token_ids)
            turn_tokens, turn_logprobs = [], []
    tokens += turn_tokens
    logprobs += turn_logprobs
    mask += [1] * len(turn_tokens)
    return tokens, logprobs, mask


def test_the_trainer_gets_the_engines_tokens_and_the_environments_replies_byte_for_byte() -> None:
    run, seen = _run([])
    data = [m for to, m in seen if to == "trainer-0" and isinstance(m, TrainData)]
    assert data and all(d.response_loss_mask is not None for d in data)
    multi_turn = 0
    assert run.session is not None
    for chunk in data:
        for traj, rid in zip(trajectories_from(chunk, 4), chunk.request_ids.tolist(), strict=True):
            tokens, logprobs, mask = _expected(seen, rid)
            assert np.asarray(traj.response_token_ids, np.int32).tobytes() == np.asarray(tokens, np.int32).tobytes()
            assert (
                np.asarray(traj.rollout_log_probs, np.float32).tobytes() == np.asarray(logprobs, np.float32).tobytes()
            )
            assert list(traj.loss_mask) == mask
            multi_turn += 0 in mask
            assert rid not in run.session.sessions  # a trained session has ended at the scheduler
    assert multi_turn > 0  # some sessions had more than one turn (digit_chain asks 1-3 questions)


def test_environment_tokens_get_no_gradient() -> None:
    _, seen = _run(["trainer.total_steps=1"])
    chunk = next(m for to, m in seen if to == "trainer-0" and isinstance(m, TrainData))
    trajectories = [t for t in trajectories_from(chunk, 4) if 0 in t.loss_mask]
    assert trajectories
    batch = collate([Sample(t) for t in trajectories], pad_token_id=0)
    for row, traj in enumerate(trajectories):
        n = traj.num_response_tokens
        assert batch.response_mask[row, :n].tolist() == [float(m) for m in traj.loss_mask]
    # the policy loss only reaches trained tokens: a loss over masked log-probs has zero gradient on env tokens
    log_probs = torch.zeros_like(batch.response_mask, requires_grad=True)
    (log_probs * batch.response_mask).sum().backward()
    assert log_probs.grad is not None
    assert bool(((log_probs.grad == 0) | (batch.response_mask == 1)).all())
    assert bool((log_probs.grad[batch.token_mask.bool() & (batch.response_mask == 0)] == 0).all())
