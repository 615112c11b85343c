"""Env worker processes: run the session scheduler's environment steps, each in its own process.

``EnvPool`` keeps ``env.num_workers`` worker processes (``psrl.envs.host.serve``, started with
``spawn``; requests and replies are msgpack over a pipe) and runs at most one step per worker at a
time; more steps wait in a queue (bounded concurrency). A step running past ``env.step_timeout_s``
is answered with a timeout error and its worker is killed and replaced (its environment may be
stuck for good). A worker that dies (a crash, SIGKILL) or freezes (SIGSTOP, or stuck holding the
interpreter: its heartbeat thread falls silent for ``HUNG_AFTER_S``) is replaced and the step it was
running is run again on a fresh worker, which rebuilds the episode by replay, up to
``env.worker_retry_limit`` times; then the step fails with that reason. Failed steps fail only their
session. Each worker's ready is reported (``EnvWorkerReady``, naming the process it replaces and why, taken with
``take_readies``), so the event log shows when a replacement serves.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from bus.messages import EnvStepDone, EnvWorkerReady
from psrl.config.system import Env
from psrl.envs.host import ALIVE, HEARTBEAT_S, READY, StepReply, StepRequest, reply_message, serve
from psrl.envs.latency import step_delay_s

READY_TIMEOUT_S = 120.0  # a fresh worker imports the tokenizer: slow on a busy machine
HUNG_AFTER_S = 10 * HEARTBEAT_S  # silence that marks a ready worker frozen (a busy 2-core host stalls for seconds)


@dataclass
class _Step:
    request: StepRequest
    attempts: int = 0
    started: float = 0.0


class _Worker:
    def __init__(
        self,
        index: int,
        context: Any,
        target: Callable[..., None],
        target_args: tuple[Any, ...],
        replaced_pid: int = 0,
        reason: str = "",
    ) -> None:
        self.index = index
        self.replaced_pid, self.reason = replaced_pid, reason
        self.started = time.monotonic()
        parent, child = context.Pipe()
        self.process = context.Process(
            target=target, args=(child, *target_args), name=f"env-worker-{index}", daemon=True
        )
        self.process.start()
        child.close()
        self.connection = parent
        self.is_ready = False
        self.step: _Step | None = None
        self.last_heard = self.started

    def ready(self, data: bytes) -> EnvWorkerReady | None:
        """The worker's first message: its ready (anything else leaves it not ready)."""
        self.is_ready = data == READY
        if not self.is_ready:
            return None
        startup_ms = (time.monotonic() - self.started) * 1000
        return EnvWorkerReady(self.index, self.process.pid or 0, self.replaced_pid, self.reason, startup_ms)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()


class EnvPool:
    """The environment port of ``psrl.flows.session.SessionFlow`` over worker processes."""

    def __init__(
        self,
        settings: Env,
        task_name: str,
        seed: int,
        tokenizer_dir: str,
        *,
        on_pipe: Callable[[Any, bool], None] | None = None,
        log: Any = None,
        agents: str = "",
        timeout_s: float = 0.0,
    ) -> None:
        """``agents``: the spec of agent workers (``psrl.gateway.runner``), each step one session's agent
        run, timed out after ``timeout_s``; empty = environment workers (``psrl.envs.host``)."""
        self.settings = settings
        self.timeout_s = timeout_s or settings.step_timeout_s
        self.seed = seed
        self.log = log
        self.on_pipe = on_pipe  # (connection, added) so the actor polls the live pipes
        self._context = multiprocessing.get_context("spawn")
        self._args: tuple[Any, ...] = (task_name, seed, tokenizer_dir)
        self._target: Callable[..., None] = serve
        if agents:
            from psrl.gateway.runner import serve_agents

            self._target, self._args = serve_agents, (agents,)
        self._decoder = msgspec.msgpack.Decoder(StepReply)
        self._encoder = msgspec.msgpack.Encoder()
        self.queue: deque[_Step] = deque()
        self.replies: list[EnvStepDone] = []
        self.readies: list[EnvWorkerReady] = []
        self.num_restarts = 0
        self.workers = [self._start(i) for i in range(settings.num_workers)]

    def _start(self, index: int, replaced_pid: int = 0, reason: str = "") -> _Worker:
        worker = _Worker(index, self._context, self._target, self._args, replaced_pid, reason)
        if self.on_pipe is not None:
            self.on_pipe(worker.connection, True)
        return worker

    # ------------------------------------------------------------------ the port

    def submit(self, request_id: int, prompt_id: int, turn: int, actions: list[np.ndarray]) -> None:
        delay = step_delay_s(self.settings, request_id, turn, self.seed)
        request = StepRequest(request_id, prompt_id, turn, [a.tolist() for a in actions], delay)
        self.queue.append(_Step(request))
        self._dispatch()

    def cancel(self, request_id: int) -> None:
        self.queue = deque(s for s in self.queue if s.request.request_id != request_id)

    # ------------------------------------------------------------------ driving

    def poll(self) -> list[EnvStepDone]:
        """Collect finished steps, replace dead and stuck workers, start queued steps; the answers."""
        now = time.monotonic()
        for worker in list(self.workers):
            self._read(worker, now)
        self._dispatch()
        out, self.replies = self.replies, []
        return out

    @property
    def num_running(self) -> int:
        return sum(w.step is not None for w in self.workers) + len(self.queue)

    def _read(self, worker: _Worker, now: float) -> None:
        try:
            while worker.connection.poll():
                data = worker.connection.recv_bytes()
                worker.last_heard = now
                if not worker.is_ready:
                    self._ready(worker, data)
                elif data != ALIVE:
                    self._answered(worker, data, now)
        except (EOFError, OSError):
            self._lost(worker, "env worker died")
            return
        if not worker.process.is_alive():
            self._lost(worker, f"env worker exited ({worker.process.exitcode})")
        elif worker.is_ready and now - worker.last_heard > HUNG_AFTER_S:
            self._lost(worker, f"env worker hung (silent for {now - worker.last_heard:.1f} s)")
        elif worker.step is not None and now - worker.step.started > self.timeout_s:
            step = worker.step
            worker.step = None
            self._fail(step, f"environment step timed out after {self.timeout_s:g} s", now)
            self._replace(worker, "timed out")

    def _answered(self, worker: _Worker, data: bytes, now: float) -> None:
        step, worker.step = worker.step, None
        if step is None:
            return
        try:
            reply = self._decoder.decode(data)
        except msgspec.DecodeError as exc:
            self._fail(step, f"malformed env worker reply: {exc}", now)
            return
        self.replies.append(reply_message(reply, worker=worker.index, latency_ms=(now - step.started) * 1000))

    def _ready(self, worker: _Worker, data: bytes) -> None:
        ready = worker.ready(data)
        if ready is not None:
            self.readies.append(ready)

    def take_readies(self) -> list[EnvWorkerReady]:
        """The workers that reported ready since the last call."""
        out, self.readies = self.readies, []
        return out

    def _lost(self, worker: _Worker, reason: str) -> None:
        step, worker.step = worker.step, None
        self._replace(worker, reason)
        if step is None:
            return
        if step.attempts <= self.settings.worker_retry_limit:
            self.queue.appendleft(step)  # run again on a fresh worker (the episode is rebuilt by replay)
        else:
            self._fail(step, f"{reason}; gave up after {step.attempts} attempts", time.monotonic())

    def _fail(self, step: _Step, error: str, now: float) -> None:
        request = step.request
        reply = StepReply(request.request_id, request.turn, [], error=error)
        self.replies.append(reply_message(reply, latency_ms=(now - step.started) * 1000))

    def _replace(self, worker: _Worker, reason: str) -> None:
        if self.on_pipe is not None:
            self.on_pipe(worker.connection, False)
        worker.kill()
        self.num_restarts += 1
        if self.log is not None:
            self.log.warning("env worker replaced", worker=worker.index, reason=reason)
        self.workers[self.workers.index(worker)] = self._start(worker.index, worker.process.pid or 0, reason)

    def _dispatch(self) -> None:
        for worker in self.workers:
            if not self.queue:
                return
            if worker.is_ready and worker.step is None:
                step = self.queue.popleft()
                step.attempts += 1
                step.started = time.monotonic()
                worker.step = step
                try:
                    worker.connection.send_bytes(self._encoder.encode(step.request))
                except (BrokenPipeError, OSError):
                    self._lost(worker, "env worker pipe closed")

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until every worker has started (so the first steps do not wait on imports)."""
        deadline = time.monotonic() + timeout_s
        while not all(w.is_ready for w in self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"env workers not ready after {timeout_s:g} s")
            for worker in self.workers:
                if not worker.is_ready and worker.connection.poll(0.05):
                    self._ready(worker, worker.connection.recv_bytes())

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
