"""Driving flows in process: messages in, effects out, nothing faked but the prompts' text.

``FixedPrompts`` stands in for the task and tokenizer (the outer edge of the coordinator): every
prompt is the same few tokens and every response scores by its length, so groups have a learning
signal. Everything else under test is the real flow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bus.messages import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InstanceStatus,
    RequestSampling,
    TrajectoryDone,
)
from bus.schema import Event, Message
from bus.stamp import Stamper
from psrl.flows.effects import Effect, Publish, Send
from psrl.tasks.base import Prompt, Reward


class FixedPrompts:
    def prompt(self, prompt_id: int) -> Prompt:
        return Prompt(index=prompt_id, kind="fixed", text="", answer="")

    def token_ids(self, prompt: Prompt) -> np.ndarray:
        return np.asarray([1, 2, 3], np.int32)

    def sampling(self, request_id: int, num_prompt_tokens: int) -> RequestSampling:
        return RequestSampling(max_tokens=16, seed=request_id)

    def score(self, prompt: Prompt, token_ids: np.ndarray) -> Reward:
        return Reward(score=len(token_ids) / 16, acc=float(len(token_ids) == 16))

    def take_metrics(self) -> dict[str, float]:
        return {}

    def take_first_error(self) -> str:
        return ""


def sent(effects: list[Effect], kind: type, to: str | None = None) -> list:
    """Messages of ``kind`` sent (to ``to``, if given)."""
    return [e.message for e in effects if isinstance(e, Send) and isinstance(e.message, kind) and to in (None, e.to)]


def published(effects: list[Effect], kind: type) -> list:
    return [e.message for e in effects if isinstance(e, Publish) and isinstance(e.message, kind)]


def destinations(effects: list[Effect], kind: type) -> list[str]:
    return [e.to for e in effects if isinstance(e, Send) and isinstance(e.message, kind)]


def status(instance: str, *, version: int = 0, seq: int = 1, running: int = 0) -> InstanceStatus:
    return InstanceStatus(
        instance=instance,
        weight_version=version,
        num_running=running,
        num_waiting=0,
        kv_blocks_used=0,
        kv_blocks_total=64,
        kv_capacity_tokens=1024,
        report_seq=seq,
    )


def request(request_id: int, n: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        prompt_id=request_id // n,
        prompt_token_ids=np.asarray([1, 2, 3], np.int32),
        sampling=RequestSampling(max_tokens=16),
    )


def result(
    req: GenerateRequest, instance: str, *, num_tokens: int, version: int = 0, error: str = ""
) -> GenerateResult:
    """An instance hands ``req`` back: finished (no error) or interrupted / aborted (``error`` says why)."""
    prior = 0 if req.generated_token_ids is None else len(req.generated_token_ids)
    versions = np.concatenate(
        [req.generated_versions if prior else np.zeros(0, np.int32), np.full(num_tokens - prior, version, np.int32)]
    )
    ids = np.concatenate(
        [req.generated_token_ids if prior else np.zeros(0, np.int32), np.arange(prior, num_tokens, dtype=np.int32) + 10]
    )
    return GenerateResult(
        request_id=req.request_id,
        prompt_id=req.prompt_id,
        token_ids=ids,
        logprobs=np.full(num_tokens, -0.5, np.float32),
        versions=versions,
        finish_reason=FinishReason.ABORT if error else FinishReason.LENGTH,
        instance=instance,
        error=error,
    )


def done(request_id: int, n: int, *, num_tokens: int, v_traj: int = 0) -> TrajectoryDone:
    return TrajectoryDone(
        request_id=request_id,
        prompt_id=request_id // n,
        v_traj=v_traj,
        token_ids=np.arange(num_tokens, dtype=np.int32),
        logprobs=np.full(num_tokens, -0.5, np.float32),
        versions=np.full(num_tokens, v_traj, np.int32),
        finish_reason=FinishReason.LENGTH,
        instance="rollout-0",
    )


class LoggedEvents:
    """An event log built in a test: each sender's events stamped in order, as the logger records them."""

    def __init__(self) -> None:
        self.events: list[Event[Any]] = []
        self.stampers: dict[str, Stamper] = {}

    def add(self, sender: str, message: Message, incarnation: int = 0, parent: str | None = None) -> Event[Any]:
        stamper = self.stampers.setdefault(f"{sender}#{incarnation}", Stamper(sender, incarnation))
        event = Event(stamper.stamp(message, parent=parent), message)
        self.events.append(event)
        return event
