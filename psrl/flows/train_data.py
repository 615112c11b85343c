"""``TrainData``, the trainer's input on the wire: built from kept groups, read back as trajectories.

The coordinator flattens a chunk's kept trajectories into one message (``train_data``); the
trainer splits it into validated ``Trajectory`` records (``trajectories_from``). Both directions
live here, so the two ends cannot drift apart. A trajectory's prompt is its group's, except for a
session that branched inside the prompt (``TrajectoryDone.prompt_keep``), which carries its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bus.messages import FinishReason, TrainData, TrajectoryDone
from psrl.coordination.chunks import Chunk
from psrl.coordination.groups import PromptGroup
from psrl.rl.trajectory import Trajectory
from psrl.tasks.base import Reward


def train_data(chunk: Chunk, groups: list[PromptGroup], *, with_logprobs: bool = True) -> TrainData:
    """Flatten the kept trajectories of ``groups`` into one TrainData message (engine log-probs only
    when the run uses them)."""
    rows: list[tuple[PromptGroup, TrajectoryDone, Reward]] = [(g, r, w) for g in groups for r, w in g.kept_results()]
    i32, f32 = np.int32, np.float32

    def cat(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)

    return TrainData(
        step=chunk.buffer + 1,
        buffer=chunk.buffer,
        chunk=chunk.index,
        num_chunks=chunk.num_chunks,
        prompt_ids=np.asarray([g.prompt_id for g, _, _ in rows], i32),
        request_ids=np.asarray([r.request_id for _, r, _ in rows], i32),
        v_traj=np.asarray([r.v_traj for _, r, _ in rows], i32),
        prompt_lengths=np.asarray([len(prompt_of(g, r)) for g, r, _ in rows], i32),
        response_lengths=np.asarray([len(r.token_ids) for _, r, _ in rows], i32),
        prompt_token_ids=cat([prompt_of(g, r) for g, r, _ in rows], i32),
        response_token_ids=cat([r.token_ids for _, r, _ in rows], i32),
        response_logprobs=cat([r.logprobs for _, r, _ in rows], f32) if with_logprobs else np.zeros(0, f32),
        response_versions=cat([r.versions for _, r, _ in rows], i32),
        rewards=np.asarray([w.score for _, _, w in rows], f32),
        accs=np.asarray([w.acc for _, _, w in rows], f32),
        finish_reasons=np.asarray([int(r.finish_reason) for _, r, _ in rows], i32),
        flags=np.asarray([r.flags for _, r, _ in rows], i32),
        response_loss_mask=_loss_mask([r for _, r, _ in rows]),
    )


def prompt_of(group: PromptGroup, result: TrajectoryDone) -> np.ndarray:
    """A trajectory's prompt: its group's, or the first ``prompt_keep`` tokens of it where its session
    branched inside the prompt (the rest of that session's call then sits in its response, untrained)."""
    if result.prompt_keep < 0:
        return group.prompt_token_ids
    return group.prompt_token_ids[: result.prompt_keep]


def _loss_mask(results: list[TrajectoryDone]) -> np.ndarray | None:
    """Concatenated loss masks (a response without one is all generated); None when none has one."""
    if all(r.loss_mask is None for r in results):
        return None
    parts = [np.ones(len(r.token_ids), np.uint8) if r.loss_mask is None else r.loss_mask for r in results]
    return np.concatenate(parts).astype(np.uint8)


_NONE = np.zeros(0, np.float32)  # an empty per-token field: not sent


def trajectories_from(data: TrainData, responses_per_prompt: int) -> list[Trajectory]:
    """Split a flattened TrainData into the trainer's Trajectory records (each validates itself); their
    per-token arrays are views of the message's, where the dtypes already agree."""
    out = []
    p_off = r_off = 0
    has_logprobs = len(data.response_logprobs) == len(data.response_token_ids)
    mask = data.response_loss_mask
    for i in range(len(data.prompt_ids)):
        p_len, r_len = int(data.prompt_lengths[i]), int(data.response_lengths[i])
        prompt = data.prompt_token_ids[p_off : p_off + p_len]
        span = slice(r_off, r_off + r_len)
        p_off, r_off = p_off + p_len, r_off + r_len
        out.append(
            Trajectory(
                prompt_id=int(data.prompt_ids[i]),
                child=int(data.request_ids[i]) % responses_per_prompt,
                prompt_token_ids=prompt,
                response_token_ids=data.response_token_ids[span],
                rollout_log_probs=data.response_logprobs[span] if has_logprobs else _NONE,
                token_versions=data.response_versions[span],
                version=int(data.v_traj[i]),
                reward=float(data.rewards[i]),
                acc=float(data.accs[i]),
                finish_reason=FinishReason(int(data.finish_reasons[i])),
                loss_mask=_NONE if mask is None else mask[span],
            )
        )
    return out
