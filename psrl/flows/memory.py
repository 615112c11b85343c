"""A flow's part in colocation (``topology.colocate``): ``tms.pause`` / ``tms.resume`` addressed to its actor
release and re-acquire the actor's managed GPU memory (``psrl.tms``), and each switch is reported as
``tms.switched`` with its duration and the memory it released or re-acquired. While paused the flow
runs nothing on the GPU (the trainer holds the data that arrives, the instance does not step).
A repeated pause is reported again: the coordinator may have missed the first report.
"""

from __future__ import annotations

from collections.abc import Callable

from bus.messages import MemoryPause, MemoryResume, MemorySwitched
from psrl.tms import SwitchReport


class MemorySwitcher:
    def __init__(self, name: str, release: Callable[[], SwitchReport], restore: Callable[[], SwitchReport]) -> None:
        self.name = name
        self.release = release
        self.restore = restore
        self.is_paused = False

    def pause(self, command: MemoryPause) -> MemorySwitched | None:
        """The report to publish, or None when the command is for other actors."""
        if self.name not in command.targets:
            return None
        self.is_paused = True
        return _switched(self.name, self.release())

    def resume(self, command: MemoryResume) -> MemorySwitched | None:
        if self.name not in command.targets:
            return None
        report = self.restore()
        self.is_paused = False
        return _switched(self.name, report)


def _switched(name: str, report: SwitchReport) -> MemorySwitched:
    return MemorySwitched(
        actor=name,
        side=report.side,
        action=report.action,
        regions=list(report.regions),
        duration_ms=report.duration_ms,
        changed_bytes=report.changed_bytes,
        free_bytes=report.free_bytes,
        region_ms=dict(report.region_ms),
    )
