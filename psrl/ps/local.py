"""Run PS shards as local processes (tests, benchmarks, single-machine tools).

In a launched run the supervisor starts shard actors; this module is the minimal stand-in that
starts each shard in its own spawned process, kills and restarts it on cue, and stops it cleanly.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from dataclasses import replace
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from types import FrameType

from psrl.ps.shard import ShardOptions, ShardServer

START_TIMEOUT_S = 60.0


def ipc_endpoints(directory: str | Path, num_shards: int) -> tuple[list[str], list[str]]:
    """(push endpoints, pull endpoints) of ``num_shards`` shards as ipc:// sockets in ``directory``."""
    base = Path(directory)
    push = [f"ipc://{base / f'ps{i}.push'}" for i in range(num_shards)]
    pull = [f"ipc://{base / f'ps{i}.pull'}" for i in range(num_shards)]
    return push, pull


def serve_shard(options: ShardOptions, ready: MpEvent | None = None) -> None:
    """Process entry point: serve one shard until SIGTERM or SIGINT."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = ShardServer(options)
    if ready is not None:
        ready.set()
    server.run(stop)


class LocalShards:
    def __init__(
        self,
        directory: str | Path,
        num_shards: int,
        transport: str = "zmq",
        serve_dtype: str | None = None,
    ) -> None:
        self.push_endpoints, self.pull_endpoints = ipc_endpoints(directory, num_shards)
        self._options = [
            ShardOptions(
                shard=i,
                num_shards=num_shards,
                push_endpoint=self.push_endpoints[i],
                pull_endpoint=self.pull_endpoints[i],
                transport=transport,
                serve_dtype=serve_dtype,
            )
            for i in range(num_shards)
        ]
        self._ctx = mp.get_context("spawn")
        self._procs: list[mp.process.BaseProcess | None] = [None] * num_shards

    def start(self) -> LocalShards:
        for shard in range(len(self._options)):
            self.restart(shard)
        return self

    def restart(self, shard: int) -> None:
        """(Re)start one shard and wait until its sockets are bound."""
        self.kill(shard)
        ready = self._ctx.Event()
        proc = self._ctx.Process(target=serve_shard, args=(self._options[shard], ready), daemon=True)
        proc.start()
        if not ready.wait(START_TIMEOUT_S):
            proc.kill()
            raise RuntimeError(f"PS shard {shard} did not start within {START_TIMEOUT_S:.0f} s")
        self._procs[shard] = proc

    def kill(self, shard: int) -> None:
        """SIGKILL one shard (a crash: nothing is flushed)."""
        proc = self._procs[shard]
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(10)
        self._procs[shard] = None

    def pid(self, shard: int) -> int | None:
        proc = self._procs[shard]
        return proc.pid if proc is not None else None

    def stop(self) -> None:
        for proc in self._procs:
            if proc is not None and proc.is_alive():
                proc.terminate()
        for shard, proc in enumerate(self._procs):
            if proc is not None:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
            self._procs[shard] = None

    def with_options(self, **changes: object) -> None:
        """Change options of every shard for their next (re)start."""
        self._options = [replace(o, **changes) for o in self._options]  # type: ignore[arg-type]

    def __enter__(self) -> LocalShards:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
