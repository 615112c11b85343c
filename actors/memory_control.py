"""An actor's part in colocation (``topology.colocate``): ``tms.pause`` / ``tms.resume`` from the coordinator
switch its GPU memory, and every switch is reported as ``tms.switched`` with its duration and the memory
it released or re-acquired. While paused the actor runs nothing on the GPU: the trainer holds the
training data that arrives meanwhile, the rollout instance does not step its engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bus.messages import MemoryPause, MemoryResume, MemorySwitched
from bus.schema import Event, Message
from psrl.tms import SwitchReport


class MemoryControl:
    def __init__(
        self,
        name: str,
        release: Callable[[], SwitchReport],
        restore: Callable[[], SwitchReport],
        publish: Callable[[Message], Any],
        *,
        on_resumed: Callable[[], None] = lambda: None,
        log: Any = None,
    ) -> None:
        self.name = name
        self.release = release
        self.restore = restore
        self.publish = publish
        self.on_resumed = on_resumed
        self.log = log
        self.is_paused = False

    def handlers(self) -> dict[type[Message], Callable[[Event[Any]], None]]:
        return {MemoryPause: self._on_pause, MemoryResume: self._on_resume}

    def _on_pause(self, event: Event[MemoryPause]) -> None:
        if self.name in event.message.targets:
            self.is_paused = True  # a repeated pause is reported again (the coordinator may have missed it)
            self._report(self.release(), event.message.reason)

    def _on_resume(self, event: Event[MemoryResume]) -> None:
        if self.name in event.message.targets:
            report = self.restore()
            self.is_paused = False
            self._report(report, event.message.reason)
            self.on_resumed()

    def _report(self, report: SwitchReport, reason: str) -> None:
        message = MemorySwitched(
            actor=self.name,
            side=report.side,
            action=report.action,
            regions=list(report.regions),
            duration_ms=report.duration_ms,
            changed_bytes=report.changed_bytes,
            free_bytes=report.free_bytes,
            region_ms=dict(report.region_ms),
        )
        self.publish(message)
        if self.log is not None:
            self.log.info(
                "memory " + report.action,
                reason=reason,
                ms=round(report.duration_ms, 1),
                gib=round(report.changed_bytes / 2**30, 3),
            )
