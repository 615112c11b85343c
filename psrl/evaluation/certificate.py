"""The staleness certificate of one trained buffer: built by the trainer, re-derived from the log.

The trainer builds it from the buffer's ``TrainData`` chunks (V_traj, per-token versions and the
router's ``TrajectoryFlags`` of each trajectory) and its own importance weights
(``is_by_trajectory``). ``psrl replay RUN --check staleness`` re-derives every field that the
generation events determine (``derive``): the router's ``group.trajectory`` events give V_traj and
the token versions, the instances' ``gen.result`` events and the router's ``gen.request`` events
give the flags. The importance weights need the trainer's log-probs, which no event carries; the
check holds them to their range instead (``is_plausible``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bus.messages import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    StalenessCertificate,
    TrainData,
    TrajectoryDone,
    TrajectoryFlags,
)
from psrl.launches import launch_of
from psrl.routing.trajectories import INTERRUPTIONS

if TYPE_CHECKING:
    from psrl.rl.batch import Sample

TRAINED = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TRUNCATED)

TrajectoryKey = tuple[int, int]  # (prompt_id, child)


def is_by_trajectory(samples: Sequence[Sample], threshold: float) -> dict[TrajectoryKey, tuple[float, float]]:
    """(mean truncated weight, clipped fraction) of each sample's tokens, from its ``is_weights`` field.

    Tokens outside the loss mask have weight 0 and are left out; a weight at the threshold was clipped.
    """
    out: dict[TrajectoryKey, tuple[float, float]] = {}
    for sample in samples:
        weights = sample.fields.get("is_weights")
        if weights is None:
            continue
        used = weights[weights > 0]
        if used.numel() == 0:
            continue
        clipped = float((used >= threshold * (1 - 1e-6)).float().mean())
        out[(sample.trajectory.prompt_id, sample.trajectory.child)] = (float(used.mean()), clipped)
    return out


def masked_by_trajectory(samples: Sequence[Sample]) -> dict[TrajectoryKey, float]:
    """Fraction of each sample's trained tokens that the rollout correction rejected (``rs_accept`` = 0).

    Samples without the field (no rejection configured) and without trained tokens are left out."""
    out: dict[TrajectoryKey, float] = {}
    for sample in samples:
        accept = sample.fields.get("rs_accept")
        if accept is None:
            continue
        trained = sample.trajectory.num_trained_tokens
        if trained == 0:
            continue
        kept = float(accept.sum())
        out[(sample.trajectory.prompt_id, sample.trajectory.child)] = max(0.0, 1.0 - kept / trained)
    return out


def _version_range(versions: np.ndarray) -> tuple[int, int]:
    return (int(versions.min()), int(versions.max())) if len(versions) else (-1, -1)


def build(
    chunks: Sequence[TrainData],
    version: int,
    is_stats: Mapping[TrajectoryKey, tuple[float, float]],
    *,
    responses_per_prompt: int,
    threshold: float,
    masked: Mapping[TrajectoryKey, float] | None = None,
    correction: str = "",
) -> StalenessCertificate:
    """The certificate of the buffer made of ``chunks`` (trained into ``version``), with the rollout
    correction applied to it (``correction``, see ``CorrectionSpec.describe``) and the fraction of
    each trajectory's tokens it rejected (``masked``; nan where no rejection is configured)."""
    rows = [_row(data, i, is_stats, masked or {}, responses_per_prompt)
            for data in chunks for i in range(len(data.request_ids))]  # fmt: skip
    i32, f32 = np.int32, np.float32
    column = list(zip(*rows, strict=True)) if rows else [()] * 8
    return StalenessCertificate(
        buffer=chunks[0].buffer if chunks else version - 1,
        version=version,
        request_ids=np.asarray(column[0], i32),
        v_traj=np.asarray(column[1], i32),
        min_token_version=np.asarray(column[2], i32),
        max_token_version=np.asarray(column[3], i32),
        flags=np.asarray(column[4], i32),
        is_mean=np.asarray(column[5], f32),
        is_clipped_frac=np.asarray(column[6], f32),
        is_threshold=threshold,
        correction=correction,
        masked_frac=np.asarray(column[7], f32),
    )


def _row(
    data: TrainData,
    i: int,
    is_stats: Mapping[TrajectoryKey, tuple[float, float]],
    masked: Mapping[TrajectoryKey, float],
    responses_per_prompt: int,
) -> tuple[int, int, int, int, int, float, float, float]:
    """Trajectory ``i`` of ``data``: id, V_traj, token-version range, flags, IS mean and clipped and masked shares."""
    offsets = np.concatenate([[0], np.cumsum(data.response_lengths)])
    rid = int(data.request_ids[i])
    low, high = _version_range(data.response_versions[offsets[i] : offsets[i + 1]])
    key = (int(data.prompt_ids[i]), rid % responses_per_prompt)
    weight_mean, clipped = is_stats.get(key, (np.nan, np.nan))
    flags = -1 if data.flags is None else int(data.flags[i])
    return rid, int(data.v_traj[i]), low, high, flags, weight_mean, clipped, masked.get(key, np.nan)


# ---------------------------------------------------------------------------- re-derivation from events


@dataclass
class _Seen:
    """What the generation events say about one trajectory id."""

    router_launch: int = -1  # a resumed run's router sends an unfinished request again, from scratch
    num_requests: int = 0  # of the current turn (a multi-turn session's turns are one trajectory)
    num_errors: int = 0  # of the current turn
    first_prompt_length: int = -1  # of the current turn
    is_turn_done: bool = False  # the last result finished a turn: the next request starts a new one
    is_continued: bool = False
    is_interrupted: bool = False
    instances: set[str] = field(default_factory=set)


class CertifiedTrajectory(NamedTuple):
    """The fields of one certificate row that the generation events determine."""

    request_id: int
    v_traj: int
    min_token_version: int
    max_token_version: int
    flags: int


class _Logged(NamedTuple):
    """A generation event of one request: when it was sent, its place in the log, and the router's launch."""

    time_ns: int
    order: int
    message: GenerateRequest | GenerateResult
    launch: int


class Derivation:
    """Rebuilds certificates from ``gen.request``, ``gen.result`` and ``group.trajectory`` events.

    A request's events are replayed in the order they were sent (the envelopes' wall clock), not the
    order the log received them: the log merges senders, so a session's next-turn request can be
    logged after the instance's result for it, which read in log order looks like a re-send of the
    finished turn continued from a longer prompt.
    """

    def __init__(self) -> None:
        self.events: dict[int, list[_Logged]] = defaultdict(list)
        self.done: dict[int, TrajectoryDone] = {}
        self._num_observed = 0

    def observe(self, message: object, sender: str = "router.link", incarnation: int = 0, time_ns: int = 0) -> None:
        """One generation event, its sender (a new router incarnation starts a request over) and its send
        time. Only the router's requests to instances count; the coordinator's to the router are the same."""
        if isinstance(message, GenerateRequest) and not sender.startswith("router"):
            return
        if isinstance(message, GenerateRequest | GenerateResult):
            self._num_observed += 1
            logged = _Logged(time_ns, self._num_observed, message, launch_of(incarnation))
            self.events[message.request_id].append(logged)
        elif isinstance(message, TrajectoryDone) and message.finish_reason in TRAINED:
            self.done[message.request_id] = message

    def trajectory(self, request_id: int) -> CertifiedTrajectory | None:
        done = self.done.get(request_id)
        if done is None:
            return None
        low, high = _version_range(done.versions)
        return CertifiedTrajectory(request_id, done.v_traj, low, high, int(_flags(self._seen(request_id))))

    def flags_so_far(self, request_id: int) -> tuple[TrajectoryFlags, set[str]]:
        """A trajectory's flags and the instances that returned results for it, from the events so far
        (what a restarted router continues the trajectory with)."""
        if request_id not in self.events:
            return TrajectoryFlags(0), set()
        seen = self._seen(request_id)
        return _flags(seen), set(seen.instances)

    def _seen(self, request_id: int) -> _Seen:
        seen = _Seen()
        for logged in sorted(self.events.get(request_id, ()), key=lambda e: (e.time_ns, e.order)):
            if isinstance(logged.message, GenerateRequest):
                seen = _on_request(seen, logged.message, logged.launch)
            else:
                _on_result(seen, logged.message)
        return seen


def _on_request(seen: _Seen, message: GenerateRequest, launch: int) -> _Seen:
    if seen.router_launch != launch:
        seen = _Seen(router_launch=launch)
    if seen.is_turn_done:  # a session's next turn, not a re-send of the finished one
        seen.is_interrupted = seen.is_interrupted or _was_resent(seen)
        seen.num_requests = seen.num_errors = 0
        seen.first_prompt_length, seen.is_turn_done = -1, False
    seen.num_requests += 1
    if seen.first_prompt_length < 0:
        seen.first_prompt_length = len(message.prompt_token_ids)
    has_prior = message.generated_token_ids is not None and len(message.generated_token_ids) > 0
    if has_prior or len(message.prompt_token_ids) > seen.first_prompt_length:  # interrupt_as_prompt
        seen.is_continued = True
    return seen


def _on_result(seen: _Seen, message: GenerateResult) -> None:
    seen.instances.add(message.instance)
    seen.is_turn_done = message.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    if message.finish_reason == FinishReason.ERROR:
        seen.num_errors += 1
    elif message.finish_reason == FinishReason.ABORT and message.error in INTERRUPTIONS:
        seen.is_interrupted = True


def _was_resent(seen: _Seen) -> bool:
    """The current turn was sent again without an interrupting result: its instance was lost."""
    return seen.num_requests > 1 + seen.num_errors


def _flags(seen: _Seen) -> TrajectoryFlags:
    flags = TrajectoryFlags(0)
    if seen.is_interrupted or _was_resent(seen):
        flags |= TrajectoryFlags.INTERRUPTED
    if seen.is_continued:
        flags |= TrajectoryFlags.CONTINUED
    if len(seen.instances) > 1:
        flags |= TrajectoryFlags.MIGRATED
    return flags


def recorded_rows(cert: StalenessCertificate) -> list[CertifiedTrajectory]:
    """The certificate's event-determined fields, row by row."""
    return [
        CertifiedTrajectory(int(r), int(v), int(lo), int(hi), int(f))
        for r, v, lo, hi, f in zip(
            cert.request_ids, cert.v_traj, cert.min_token_version, cert.max_token_version, cert.flags, strict=True
        )
    ]


def is_plausible(cert: StalenessCertificate) -> bool:
    """The correction columns are in range: weights in (0, threshold], clipped and masked fractions in [0, 1]."""
    means = cert.is_mean[~np.isnan(cert.is_mean)]
    fracs = cert.is_clipped_frac[~np.isnan(cert.is_clipped_frac)]
    masked = cert.masked_frac[~np.isnan(cert.masked_frac)] if cert.masked_frac is not None else np.zeros(0)
    masked_ok = bool(np.all((masked >= 0) & (masked <= 1)))
    if cert.is_threshold <= 0:
        return len(means) == 0 and len(fracs) == 0 and masked_ok
    in_range = bool(np.all(means > 0)) and bool(np.all(means <= cert.is_threshold * (1 + 1e-5)))
    return in_range and masked_ok and bool(np.all((fracs >= 0) & (fracs <= 1)))


def staleness_problems(cert: StalenessCertificate, staleness: int) -> list[str]:
    """Rows that break the staleness bound ``V_traj <= buffer <= V_traj + staleness`` or the version order."""
    problems = []
    if cert.version != cert.buffer + 1:
        problems.append(f"buffer {cert.buffer} produced version {cert.version}, not {cert.buffer + 1}")
    for row in recorded_rows(cert):
        if not row.v_traj <= cert.buffer <= row.v_traj + staleness:
            problems.append(f"trajectory {row.request_id}: V_traj {row.v_traj} in buffer {cert.buffer} "
                            f"(staleness {staleness})")  # fmt: skip
        if row.min_token_version >= 0 and row.max_token_version > cert.buffer:
            problems.append(f"trajectory {row.request_id}: a token of version {row.max_token_version} "
                            f"trained in buffer {cert.buffer}")  # fmt: skip
    return problems
