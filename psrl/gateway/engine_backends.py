"""The embedded engine behind the in-process gateway, on a thread or in a process of its own.

Both take requests (``submit``, ``abort``) from the gateway's sessions thread and hand back
finished turns (``results``) when their ``fileno`` is readable. A turn's engine time is the
engine's own request latency: from the hand-off to its input queue to its result (what any
frontend of this engine would wait for it, the step in progress included).

* ``ThreadEngine``: the engine steps on a thread of this process (quick to start: the tests).
* ``ProcessEngine``: the engine in a child process, as a run's engine is (a rollout instance),
  so its steps do not hold the gateway's interpreter (``tools/bench_gateway.py``). Requests and
  results cross a pipe as msgpack.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec

_IDLE_WAIT_S = 0.05  # how often an idle engine looks at its stop flag


@dataclass(frozen=True)
class EngineSpec:
    model_dir: str
    seed: int = 0
    temperature: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    num_logprobs: int = 0  # alternatives per generated token (top_logprobs)
    torch_threads: int = 0  # 0: torch's default
    niceness: int = 0  # added to the engine process's nice value (the gateway answers first on a shared core)
    args: tuple[tuple[str, Any], ...] = ()  # more EngineArgs


class Finished(msgspec.Struct, array_like=True):
    request_id: str
    output_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: int
    engine_ms: float


class _Request(msgspec.Struct, array_like=True):
    request_id: str
    prompt: list[int] = []
    max_tokens: int = 0
    arrived: float = 0.0  # perf_counter at the hand-off (abort: none)
    abort: bool = False


def build_engine(spec: EngineSpec) -> Any:
    from psrl.engine import Engine, EngineArgs

    if spec.torch_threads:
        import torch

        torch.set_num_threads(spec.torch_threads)
    return Engine(EngineArgs(model_path=spec.model_dir, seed=spec.seed, cpu_kernels="off", **dict(spec.args)))


class _Stepper:
    """Takes requests into the engine, steps it, and reports each finished request once."""

    def __init__(self, engine: Any, spec: EngineSpec) -> None:
        from psrl.engine import SamplingParams

        self.engine, self.spec, self.arrived = engine, spec, dict[str, float]()
        self.params = SamplingParams

    def take(self, request: _Request) -> None:
        if request.abort:
            self.engine.abort(request.request_id)
            self.arrived.pop(request.request_id, None)
            return
        sampling = self.params(
            max_tokens=request.max_tokens,
            temperature=self.spec.temperature,
            stop_token_ids=self.spec.stop_token_ids,
            num_logprobs=self.spec.num_logprobs,
        )
        self.arrived[request.request_id] = request.arrived
        self.engine.add_request(request.request_id, request.prompt, sampling)

    def step(self) -> list[Finished]:
        out = self.engine.step()
        done = time.perf_counter()
        return [
            Finished(
                r.request_id,
                list(r.output_ids),
                list(r.logprobs),
                [list(t) for t in r.top_logprobs] if r.top_logprobs is not None else None,
                int(r.finish_reason),
                (done - self.arrived.pop(r.request_id, done)) * 1000,
            )
            for r in out.finished
        ]

    @property
    def busy(self) -> bool:
        return bool(self.engine.has_unfinished_requests())


class ThreadEngine:
    def __init__(self, spec: EngineSpec) -> None:
        self.engine = build_engine(spec)
        self.max_model_len = int(self.engine.max_model_len)
        self._stepper = _Stepper(self.engine, spec)
        self._inbox: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._reader.close()
        self._writer.close()

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self._inbox.put(_Request(request_id, prompt, max_tokens, time.perf_counter()))

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Request(request_id, abort=True))

    def fileno(self) -> int:
        return self._reader.fileno()

    def results(self) -> list[Finished]:
        _drain(self._reader)
        found = []
        while not self._done.empty():
            found.append(self._done.get_nowait())
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._stepper.busy:
                try:
                    self._stepper.take(self._inbox.get(timeout=_IDLE_WAIT_S))
                except queue.Empty:
                    continue
            while not self._inbox.empty():
                self._stepper.take(self._inbox.get_nowait())
            if self._stepper.busy:
                finished = self._stepper.step()
                for result in finished:
                    self._done.put(result)
                if finished:
                    _wake(self._writer)


class ProcessEngine:
    def __init__(self, spec: EngineSpec, start_timeout_s: float = 300.0) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, spec), name="gateway-engine", daemon=True)
        self._process.start()
        child.close()
        try:
            if not self._conn.poll(start_timeout_s):
                raise EOFError
            self.max_model_len = int(msgspec.msgpack.decode(self._conn.recv_bytes()))
        except (EOFError, OSError):
            self._process.kill()
            self._process.join(timeout=5)
            raise RuntimeError(
                f"the gateway's engine process did not start within {start_timeout_s:.0f} s "
                f"(exit code {self._process.exitcode}; its error is above)"
            ) from None
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(list[Finished])

    def start(self) -> None:
        pass

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # a child already gone
            self._conn.send_bytes(b"")  # the child's stop
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
        self._conn.close()

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self._conn.send_bytes(self._encoder.encode(_Request(request_id, prompt, max_tokens, time.perf_counter())))

    def abort(self, request_id: str) -> None:
        self._conn.send_bytes(self._encoder.encode(_Request(request_id, abort=True)))

    def fileno(self) -> int:
        return int(self._conn.fileno())

    def results(self) -> list[Finished]:
        found: list[Finished] = []
        while self._conn.poll():
            found += self._decoder.decode(self._conn.recv_bytes())
        return found


def _serve(conn: Any, spec: EngineSpec) -> None:
    """The engine process: requests in, finished turns out, until the parent says stop or goes away."""
    if spec.niceness:
        os.nice(spec.niceness)
    engine = build_engine(spec)
    stepper = _Stepper(engine, spec)
    decoder, encoder = msgspec.msgpack.Decoder(_Request), msgspec.msgpack.Encoder()
    conn.send_bytes(encoder.encode(engine.max_model_len))
    try:
        while True:
            if not stepper.busy and not conn.poll(_IDLE_WAIT_S):
                continue
            while conn.poll():
                raw = conn.recv_bytes()
                if not raw:
                    return
                stepper.take(decoder.decode(raw))
            if stepper.busy:
                finished = stepper.step()
                if finished:
                    conn.send_bytes(encoder.encode(finished))
    except (EOFError, OSError):  # the parent went away
        return


def _wake(writer: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError):  # wake-ups pending already
        writer.send(b"\0")


def _drain(reader: socket.socket) -> None:
    try:
        while reader.recv(4096):
            pass
    except BlockingIOError:
        pass
