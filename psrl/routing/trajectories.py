"""What the router remembers about each trajectory, and what a returned result means.

A trajectory is pinned to ``v_traj`` at its first routing and accumulates its tokens, their
log-probabilities and the weight version of each token from the instance's stream. When an
instance hands a request back interrupted (a weight sync, a migration, a preemption loopback,
the instance shutting down or dying), partial rollout continues it elsewhere from exactly those
tokens; an abort that was asked for (surplus child, staleness, the coordinator) ends it. Pure
bookkeeping: no sockets, no clock.

A multi-turn session is one trajectory whose response grows by turns: each turn's generated
tokens, then the environment's reply (``start_turn``), exactly as fed to the engine (token in,
token out). ``loss_mask`` marks the generated tokens (1) apart from the environment's (0);
everything before ``turn_start`` goes to the engine as prompt, so an interrupted turn continues
from its own tokens and a restart only drops the current turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import msgspec
import numpy as np

from bus.messages import FinishReason, GenerateRequest, GenerateResult, RequestSampling, TrajectoryDone, TrajectoryFlags

# Reasons an instance gives for handing a request back that is not the end of the trajectory.
INTERRUPTIONS = frozenset({"sync", "migrate", "preempted", "shutdown", "instance_lost", "router_restart"})


class TrackerVerdict(str, Enum):
    FINISHED = "finished"  # stop or length: the trajectory is complete
    CONTINUE = "continue"  # interrupted: route it again from its tokens (partial rollout)
    RESTART = "restart"  # interrupted without partial rollout: route it again from the prompt
    RETRY = "retry"  # the request failed; try it again
    ABORTED = "aborted"  # ended on request (surplus, staleness, coordinator)
    FAILED = "failed"  # failed for good


_NO_IDS = np.zeros(0, np.int32)
_NO_LOGPROBS = np.zeros(0, np.float32)
_NO_MASK = np.zeros(0, np.uint8)


@dataclass
class TrackedTrajectory:
    request_id: int
    prompt_id: int
    child: int
    prompt_ids: np.ndarray
    sampling: RequestSampling
    v_traj: int = -1
    token_ids: np.ndarray = field(default_factory=lambda: _NO_IDS)  # int32, the response so far
    logprobs: np.ndarray = field(default_factory=lambda: _NO_LOGPROBS)  # float32
    versions: np.ndarray = field(default_factory=lambda: _NO_IDS)  # int32, weight version per token
    instance: str | None = None
    num_loopbacks: int = 0
    num_failures: int = 0
    abort_reason: str | None = None  # set once an abort was asked for: the result ends it
    error: str = ""
    num_sent_as_prompt: int = 0  # interrupt_as_prompt: earlier output the instance got as prompt
    flags: int = 0  # TrajectoryFlags bits, for the staleness certificate
    result_instances: set[str] = field(default_factory=set)  # every instance that returned a result for it
    loss_mask: np.ndarray = field(default_factory=lambda: _NO_MASK)  # uint8 per token: 1 generated, 0 environment
    turn: int = 0  # sessions: index of the turn being generated
    turn_start: int = 0  # sessions: response tokens before the current turn (sent as prompt)
    in_env: bool = False  # sessions: the turn finished and the environment step is pending
    env_reward: float | None = None
    env_acc: float | None = None
    prompt_keep: int = -1  # sessions: the prompt was cut to this many tokens (a branch inside it); -1: whole

    @property
    def num_generated(self) -> int:
        return len(self.token_ids)

    @property
    def has_env_tokens(self) -> bool:
        return self.turn > 0


@dataclass(frozen=True)
class TrackerSettings:
    partial_rollout: bool = True
    interrupt_as_prompt: bool = False
    retry_limit: int = 1


class TrajectoryTracker:
    def __init__(self, settings: TrackerSettings) -> None:
        self.settings = settings
        self.live: dict[int, TrackedTrajectory] = {}
        self.num_loopbacks = 0
        self.num_wasted_tokens = 0  # generated, then thrown away (aborts, restarts)

    def add(self, request: GenerateRequest, child: int) -> TrackedTrajectory:
        traj = TrackedTrajectory(
            request_id=request.request_id,
            prompt_id=request.prompt_id,
            child=child,
            prompt_ids=np.asarray(request.prompt_token_ids, np.int32),
            sampling=request.sampling,
        )
        if request.generated_token_ids is not None:
            traj.token_ids = _ids(request.generated_token_ids)
            traj.logprobs = _logprobs(request.generated_logprobs)
            traj.versions = _ids(request.generated_versions)
            traj.loss_mask = np.ones(len(traj.token_ids), np.uint8)
        self.live[request.request_id] = traj
        return traj

    def extend(self, request_id: int, token_ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray) -> None:
        """Append streamed tokens (ignored for a trajectory the router no longer tracks).

        Streamed tokens are what a continuation starts from if the instance dies."""
        traj = self.live.get(request_id)
        if traj is not None:
            traj.token_ids = np.concatenate([traj.token_ids, _ids(token_ids)])
            traj.logprobs = np.concatenate([traj.logprobs, _logprobs(logprobs)])
            traj.versions = np.concatenate([traj.versions, _ids(versions)])
            traj.loss_mask = np.concatenate([traj.loss_mask, np.ones(len(token_ids), np.uint8)])

    def judge(self, result: GenerateResult) -> TrackerVerdict:
        """Classify a returned result and bring the trajectory's tokens up to date with it."""
        traj = self.live[result.request_id]
        traj.result_instances.add(result.instance)
        if len(traj.result_instances) > 1:
            traj.flags |= TrajectoryFlags.MIGRATED
        if result.finish_reason == FinishReason.ERROR:
            traj.num_failures += 1
            traj.error = result.error
            return TrackerVerdict.RETRY if traj.num_failures <= self.settings.retry_limit else TrackerVerdict.FAILED
        self._take_tokens(traj, result)
        if result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            return TrackerVerdict.FINISHED
        if traj.abort_reason is not None or result.error not in INTERRUPTIONS:
            traj.abort_reason = traj.abort_reason or result.error or "aborted"
            return TrackerVerdict.ABORTED
        return self.interrupted(traj)

    def interrupted(self, traj: TrackedTrajectory) -> TrackerVerdict:
        """The trajectory left its instance unfinished; continue it, or start it over."""
        traj.instance = None
        traj.flags |= TrajectoryFlags.INTERRUPTED
        if self.settings.partial_rollout:
            traj.num_loopbacks += 1
            self.num_loopbacks += 1
            return TrackerVerdict.CONTINUE
        self.num_wasted_tokens += traj.num_generated - traj.turn_start
        _keep_first(traj, traj.turn_start)
        return TrackerVerdict.RESTART

    def _take_tokens(self, traj: TrackedTrajectory, result: GenerateResult) -> None:
        """A result carries every token the instance generated or continued from; output it got
        as prompt (interrupt_as_prompt) is kept from the router's own record."""
        keep = traj.num_sent_as_prompt
        _keep_first(traj, keep)
        traj.token_ids = np.concatenate([traj.token_ids, _ids(result.token_ids)])
        traj.logprobs = np.concatenate([traj.logprobs, _logprobs(result.logprobs)])
        traj.versions = np.concatenate([traj.versions, _ids(result.versions)])
        traj.loss_mask = np.concatenate([traj.loss_mask, np.ones(len(result.token_ids), np.uint8)])
        traj.num_sent_as_prompt = 0

    def start_turn(self, traj: TrackedTrajectory, observation: np.ndarray, max_tokens: int) -> None:
        """A session's next turn: the environment's reply joins the response untrained (log-prob 0,
        the version of the token before it), and the turn generates up to ``max_tokens`` after it."""
        observation = _ids(observation)
        version = int(traj.versions[-1]) if len(traj.versions) else traj.v_traj
        traj.token_ids = np.concatenate([traj.token_ids, observation])
        traj.logprobs = np.concatenate([traj.logprobs, np.zeros(len(observation), np.float32)])
        traj.versions = np.concatenate([traj.versions, np.full(len(observation), version, np.int32)])
        traj.loss_mask = np.concatenate([traj.loss_mask, np.zeros(len(observation), np.uint8)])
        traj.turn += 1
        traj.turn_start = traj.num_generated
        traj.in_env = False
        seed = None if traj.sampling.seed is None else (traj.sampling.seed + 7919 * traj.turn) % (2**31)
        traj.sampling = msgspec.structs.replace(traj.sampling, max_tokens=max_tokens, min_tokens=0, seed=seed)

    def engine_request(self, traj: TrackedTrajectory, dispatch_seq: int) -> GenerateRequest:
        """The request an instance gets: fresh, or a continuation from the tokens so far. A session's
        earlier turns and environment replies go as prompt; the current turn's tokens continue."""
        in_turn = traj.num_generated - traj.turn_start
        as_prompt = traj.turn_start
        sampling = traj.sampling
        if in_turn > 0:
            traj.flags |= TrajectoryFlags.CONTINUED
        if in_turn > 0 and self.settings.interrupt_as_prompt:
            as_prompt = traj.num_generated
            sampling = _with_max_tokens(traj.sampling, max(1, traj.sampling.max_tokens - in_turn), in_turn)
        traj.num_sent_as_prompt = as_prompt
        has_prior = traj.num_generated > as_prompt
        prompt = traj.prompt_ids if as_prompt == 0 else np.concatenate([traj.prompt_ids, traj.token_ids[:as_prompt]])
        return GenerateRequest(
            request_id=traj.request_id,
            prompt_id=traj.prompt_id,
            prompt_token_ids=prompt,
            sampling=sampling,
            pinned_version=traj.v_traj,
            generated_token_ids=traj.token_ids[as_prompt:] if has_prior else None,
            generated_logprobs=traj.logprobs[as_prompt:] if has_prior else None,
            generated_versions=traj.versions[as_prompt:] if has_prior else None,
            dispatch_seq=dispatch_seq,
        )

    def done(self, traj: TrackedTrajectory, reason: FinishReason, instance: str) -> TrajectoryDone:
        """The trajectory's end, as the coordinator receives it: its whole response, or why it was given up."""
        return TrajectoryDone(
            request_id=traj.request_id,
            prompt_id=traj.prompt_id,
            v_traj=traj.v_traj,
            token_ids=traj.token_ids,
            logprobs=traj.logprobs,
            versions=traj.versions,
            finish_reason=reason,
            instance=instance,
            error=traj.error if reason == FinishReason.ERROR else (traj.abort_reason or ""),
            flags=int(traj.flags),
            loss_mask=traj.loss_mask if traj.has_env_tokens else None,
            env_reward=traj.env_reward,
            env_acc=traj.env_acc,
            num_turns=traj.turn + 1 if traj.env_reward is not None else 0,
            prompt_keep=traj.prompt_keep,
        )

    def finish(self, request_id: int, *, wasted: bool = False) -> TrackedTrajectory | None:
        traj = self.live.pop(request_id, None)
        if traj is not None and wasted:
            self.num_wasted_tokens += traj.num_generated
        return traj


def _keep_first(traj: TrackedTrajectory, count: int) -> None:
    traj.token_ids, traj.logprobs = traj.token_ids[:count], traj.logprobs[:count]
    traj.versions, traj.loss_mask = traj.versions[:count], traj.loss_mask[:count]


def _ids(values: np.ndarray | None) -> np.ndarray:
    return _NO_IDS if values is None else np.asarray(values, np.int32)


def _logprobs(values: np.ndarray | None) -> np.ndarray:
    return _NO_LOGPROBS if values is None else np.asarray(values, np.float32)


def _with_max_tokens(sampling: RequestSampling, max_tokens: int, num_done: int) -> RequestSampling:
    return msgspec.structs.replace(sampling, max_tokens=max_tokens, min_tokens=max(0, sampling.min_tokens - num_done))
