"""A parameter-server shard: hosts one `ShardServer` and announces its versions on the bus.

The shard's sockets run in their own thread (pushes and pulls never wait for the actor loop);
its version hooks are queued and published from the actor loop, where the publisher lives, which a
byte on a pipe wakes at once: a synchronous step waits for the publication.
Shard 0 commits last, so its commit is the run's `WeightsPublished`: when it fires, every
shard already serves the version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading

from actors.base import Actor
from bus.messages import ShardStored, WeightsPublished
from psrl.engine.args import EngineArgs
from psrl.ps import ShardServer, VersionEvent
from psrl.ps.from_config import shard_options


class ParameterShardActor(Actor):
    ROLE = "ps"
    WARM_IMPORTS = (*Actor.WARM_IMPORTS, "torch", "psrl.ps")
    SERVES_REQUESTS = True

    def setup(self) -> dict[str, int]:
        args = EngineArgs.from_config(self.config)
        engine_dtype = args.resolve_dtype(args.resolve_device())
        options = shard_options(
            self.config,
            self.boot.index,
            self.boot.endpoint(self.name),
            self.boot.endpoint(f"{self.name}.1"),
            engine_dtype,
            curve=self.bus.options.curve,
            run_dir=self.boot.run_dir,
        )
        options = dataclasses.replace(options, host=self.boot.host)
        self.events: queue.SimpleQueue[tuple[str, VersionEvent]] = queue.SimpleQueue()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)
        self.add_input(self.wake_read, self._on_wake)
        self.server = ShardServer(
            options,
            on_commit=lambda e: self._queue("commit", e),
            on_stored=lambda e: self._queue("stored", e),
            on_failed=lambda _: self._wake(),
        )
        self.thread, self.stop_server = self.server.start_thread()
        return {"shard": self.boot.index}

    def _queue(self, what: str, event: VersionEvent) -> None:
        """In the server's thread: hand the event to the actor loop and wake it."""
        self.events.put((what, event))
        self._wake()

    def _wake(self) -> None:
        # a full pipe already holds a wake-up; a closed one means the actor is past its teardown
        with contextlib.suppress(OSError):
            os.write(self.wake_write, b"\0")

    def _on_wake(self) -> None:
        os.read(self.wake_read, 4096)
        self._announce()
        failure = self.server.failure
        if failure is not None:  # the actor ends with it: its restart policy applies, the reason is logged
            raise RuntimeError(f"shard {self.boot.index} stopped serving: {type(failure).__name__}: {failure}")

    def drop_counts(self) -> dict[str, int]:
        counts = super().drop_counts()
        server = getattr(self, "server", None)
        if server is not None:  # counted in the server's thread: a snapshot is close enough for a report
            dropped = {k: n for k, n in dict(server.counters).items() if k.startswith("dropped_") and n}
            counts.update({f"{self.name}:ps:{k.removeprefix('dropped_')}": n for k, n in dropped.items()})
        return counts

    def _announce(self) -> None:
        while not self.events.empty():
            what, event = self.events.get()
            if what == "stored":
                msg = ShardStored(event.version, event.shard, event.num_entries, event.num_bytes, event.digest.hex())
                self.publisher.publish(msg, model_version=event.version)
            elif event.is_announcer:
                published = WeightsPublished(event.version, event.digest.hex(), event.num_shards)
                self.publisher.publish(published, model_version=event.version)
                self.log.info("published", version=event.version)

    def teardown(self) -> None:
        stop: threading.Event | None = getattr(self, "stop_server", None)
        if stop is not None:
            stop.set()
            self.thread.join(timeout=5)
            self.server.close()
            self._announce()
        if hasattr(self, "wake_read"):
            self.remove_input(self.wake_read)
            os.close(self.wake_read)
            os.close(self.wake_write)
