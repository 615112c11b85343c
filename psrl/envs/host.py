"""Runs environment steps: the episode of each session, its tokenizer, and the step wire format.

A step request carries every action of the session so far (token ids per turn), so any host can
answer it: a host that has not seen the session (a fresh worker after a crash) rebuilds the
episode by replaying the earlier actions, which environments answer deterministically. Actions
are decoded to text for the environment, and its observation is encoded once, on its own, and
appended to the session as is (token in, token out: the session is never re-tokenised).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from bus.messages import EnvStepDone
from psrl.envs.base import Environment, checked
from psrl.envs.registry import get_env_task


class StepRequest(msgspec.Struct, frozen=True):
    request_id: int
    prompt_id: int
    turn: int
    actions: list[list[int]]  # generated tokens of turns 0..turn
    delay_s: float = 0.0  # modelled tool latency


class StepReply(msgspec.Struct, frozen=True):
    request_id: int
    turn: int
    observation_token_ids: list[int]
    reward: float = 0.0
    acc: float = 0.0
    done: bool = False
    error: str = ""


@dataclass
class _Episode:
    env: Environment
    num_steps: int


class _Tokenizer:
    """The model's tokenizer for actions and observations: its ``tokenizer.json`` through the
    ``tokenizers`` library when there is one (a worker starts in well under a second), else
    ``transformers``."""

    def __init__(self, tokenizer_dir: str) -> None:
        path = Path(tokenizer_dir) / "tokenizer.json"
        if path.is_file():
            from tokenizers import Tokenizer

            fast = Tokenizer.from_file(str(path))
            self.encode: Callable[[str], list[int]] = lambda text: fast.encode(text, add_special_tokens=False).ids
            self.decode: Callable[[list[int]], str] = lambda ids: fast.decode(ids, skip_special_tokens=True)
            return
        from transformers import AutoTokenizer

        slow: Any = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.encode = lambda text: list(slow.encode(text, add_special_tokens=False))
        self.decode = lambda ids: str(slow.decode(ids, skip_special_tokens=True))


class EnvHost:
    def __init__(self, task_name: str, seed: int, tokenizer_dir: str, *, max_episodes: int = 4096) -> None:
        self.task = get_env_task(task_name, seed)
        self.tokenizer = _Tokenizer(tokenizer_dir)
        self.episodes: dict[int, _Episode] = {}
        self.max_episodes = max_episodes

    def run(self, request: StepRequest) -> StepReply:
        """Answer one step; an environment that raises or answers malformed gives an error reply."""
        try:
            episode = self._episode(request)
            if request.delay_s > 0:
                time.sleep(request.delay_s)
            action = self.tokenizer.decode(request.actions[-1])
            result = checked(episode.env.step(action))
            episode.num_steps += 1
        except Exception as exc:  # an environment is user code: any failure fails only its session
            self.episodes.pop(request.request_id, None)
            return StepReply(request.request_id, request.turn, [], error=f"{type(exc).__name__}: {exc}")
        if result.done:
            self.episodes.pop(request.request_id, None)
        observation = [] if result.done else self.tokenizer.encode(result.observation)
        return StepReply(
            request.request_id, request.turn, observation, float(result.reward), float(result.acc), result.done
        )

    def _episode(self, request: StepRequest) -> _Episode:
        """The session's episode at the step before ``request.turn``: kept, or rebuilt by replay."""
        episode = self.episodes.get(request.request_id)
        if episode is not None and episode.num_steps == request.turn:
            return episode
        env = self.task.make(self.task.prompt(request.prompt_id))
        env.reset()
        for earlier in request.actions[: request.turn]:
            checked(env.step(self.tokenizer.decode(earlier)))
        episode = _Episode(env, request.turn)
        if len(self.episodes) >= self.max_episodes:
            self.episodes.pop(next(iter(self.episodes)))
        self.episodes[request.request_id] = episode
        return episode

    def forget(self, request_id: int) -> None:
        self.episodes.pop(request_id, None)


READY, ALIVE = b"ready", b"alive"  # a worker's first message; its heartbeat
HEARTBEAT_S = 0.5


def serve(connection: Any, task_name: str, seed: int, tokenizer_dir: str) -> None:
    """An env worker process: answer msgpack step requests on ``connection`` (a pipe) until it closes."""
    serve_steps(connection, EnvHost(task_name, seed, tokenizer_dir).run, "env-heartbeat")


def serve_steps(connection: Any, run: Callable[[StepRequest], StepReply], heartbeat_name: str) -> None:
    """A worker's loop: each msgpack step request on ``connection`` answered by ``run``, until it closes.

    A thread sends ``ALIVE`` every ``HEARTBEAT_S`` meanwhile, also while a step runs: a worker that
    falls silent is frozen (stopped, or stuck holding the interpreter), not merely slow.
    """
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(StepRequest)
    sending = threading.Lock()
    connection.send_bytes(READY)
    threading.Thread(target=_beat, args=(connection, sending), name=heartbeat_name, daemon=True).start()
    while True:
        try:
            data = connection.recv_bytes()
        except (EOFError, OSError):
            return
        reply = encoder.encode(run(decoder.decode(data)))
        with sending:
            connection.send_bytes(reply)


def _beat(connection: Any, sending: threading.Lock) -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        try:
            with sending:
                connection.send_bytes(ALIVE)
        except (EOFError, OSError):
            return


def reply_message(reply: StepReply, *, worker: int = -1, latency_ms: float = 0.0) -> EnvStepDone:
    return EnvStepDone(
        request_id=reply.request_id,
        turn=reply.turn,
        observation_token_ids=np.asarray(reply.observation_token_ids, np.int32),
        reward=reply.reward,
        acc=reply.acc,
        done=reply.done,
        error=reply.error,
        worker=worker,
        latency_ms=latency_ms,
    )


class InProcessEnv:
    """The environment port without processes (the in-process driver, tests): each step runs when
    submitted and its answer waits in ``replies`` until the driver hands it to the flow."""

    def __init__(self, host: EnvHost) -> None:
        self.host = host
        self.replies: list[EnvStepDone] = []

    def submit(self, request_id: int, prompt_id: int, turn: int, actions: list[np.ndarray]) -> None:
        request = StepRequest(request_id, prompt_id, turn, [a.tolist() for a in actions])
        self.replies.append(reply_message(self.host.run(request), worker=0))

    def cancel(self, request_id: int) -> None:
        self.host.forget(request_id)
        self.replies = [r for r in self.replies if r.request_id != request_id]

    def take(self) -> list[EnvStepDone]:
        out, self.replies = self.replies, []
        return out
