"""Per-instance status snapshots on disk (`psrl.status_collection.stats_recorder`).

A launcher listener: every `inst.status` event it sees is written to
``<run>/status/<instance>.jsonl``, at most one line per instance per ``interval_in_s``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import msgspec

from bus.messages import InstanceStatus
from bus.schema import Event
from psrl.rundir import RunDir


class StatusRecorder:
    def __init__(self, run_dir: RunDir, interval_s: float) -> None:
        self.directory = run_dir.status
        self.interval_s = interval_s
        self._files: dict[str, IO[str]] = {}
        self._last: dict[str, float] = {}

    def on_event(self, event: Event[Any]) -> None:
        msg = event.message
        if not isinstance(msg, InstanceStatus):
            return
        when = event.envelope.wall_ns / 1e9
        if when - self._last.get(msg.instance, float("-inf")) < self.interval_s:
            return
        self._last[msg.instance] = when
        line = {"wall_time": when, **msgspec.structs.asdict(msg)}
        self._file(msg.instance).write(json.dumps(line) + "\n")

    def _file(self, instance: str) -> IO[str]:
        handle = self._files.get(instance)
        if handle is None:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            handle = self._files[instance] = (Path(self.directory) / f"{instance}.jsonl").open("a", buffering=1)
        return handle

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
