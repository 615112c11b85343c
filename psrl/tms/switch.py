"""The consume/generate cycle of colocated training and rollout, as pause and resume commands (pure).

The trainer holds the shared GPUs while a buffer it was handed has not been trained yet; otherwise
rollout holds them. A switch first pauses the side holding the GPUs, waits until every addressed
actor reports its memory released, and only then resumes the other side, so the two are never
resident at once. A side the ``psrl.tms.range`` leaves unmanaged is never paused or resumed: its
memory stays resident (``range=train``: the engine keeps its weights and KV cache while the
trainer steps). At the start both sides are resident (each allocated its memory while starting),
so the first switch only pauses the trainer.

Inputs are what the coordinator learns: buffers handed over, versions trained, ``tms.switched``
reports, actors that exited, and the time; outputs are ``SwitchCommand`` values the coordinator
turns into ``tms.pause`` / ``tms.resume`` messages. A pause that is not acknowledged within
``retry_after_s`` is sent again to the actors that have not answered (an actor answers a repeated
pause with another report).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from psrl.tms.regions import ROLLOUT, SIDES, TRAINER

START_RETRY_S = 0.5  # the run's first pause, sent before the actors subscribed: re-sent soon


@dataclass(frozen=True, slots=True)
class SwitchCommand:
    action: str  # "pause" | "resume"
    side: str
    targets: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class CompletedSwitch:
    to_side: str
    started_s: float
    finished_s: float  # the paused side's last report; the other side's resume is sent at this time

    @property
    def pause_wait_ms(self) -> float:
        return (self.finished_s - self.started_s) * 1000


class ColocationSwitch:
    def __init__(
        self,
        trainers: Iterable[str],
        instances: Iterable[str],
        managed: Iterable[str],
        *,
        trained_version: int = 0,
        retry_after_s: float = 5.0,
    ) -> None:
        self.members = {TRAINER: list(trainers), ROLLOUT: list(instances)}
        self.managed = frozenset(managed)
        unknown = self.managed - set(SIDES)
        if unknown:
            raise ValueError(f"unknown sides {sorted(unknown)}")
        self.handed = trained_version  # one past the last buffer handed to the trainer
        self.trained = trained_version
        self.holder: str | None = None  # None: both sides resident (the start)
        self.going_to: str | None = None
        self.waiting: set[str] = set()
        self.started_s = self.sent_s = 0.0
        self.retry_after_s = retry_after_s
        self.completed: list[CompletedSwitch] = []

    @property
    def wanted(self) -> str:
        return TRAINER if self.handed > self.trained else ROLLOUT

    @property
    def is_switching(self) -> bool:
        return self.going_to is not None

    # ------------------------------------------------------------------ inputs

    def start(self, now: float) -> list[SwitchCommand]:
        return self._advance(now)

    def handed_over(self, buffer: int, now: float) -> list[SwitchCommand]:
        self.handed = max(self.handed, buffer + 1)
        return self._advance(now)

    def trained_version(self, version: int, now: float) -> list[SwitchCommand]:
        self.trained = max(self.trained, version)
        return self._advance(now)

    def switched(self, actor: str, action: str, now: float) -> list[SwitchCommand]:
        """An actor's ``tms.switched`` report; only pauses the switch waits for count."""
        if action != "pause" or actor not in self.waiting:
            return []
        self.waiting.discard(actor)
        return self._arrive(now) if not self.waiting else []

    def exited(self, actor: str, now: float) -> list[SwitchCommand]:
        """A dead actor holds no memory: it is no longer waited for (a restart rejoins with ``rejoined``)."""
        for members in self.members.values():
            if actor in members:
                members.remove(actor)
        if actor in self.waiting:
            self.waiting.discard(actor)
            if not self.waiting:
                return self._arrive(now)
        return []

    def rejoined(self, actor: str, side: str, now: float) -> list[SwitchCommand]:
        """A restarted actor starts resident: paused again at once when its side does not hold the GPUs."""
        if actor not in self.members[side]:
            self.members[side].append(actor)
        if side in self.managed and self.holder is not None and self.holder != side:
            return [SwitchCommand("pause", side, (actor,), "restarted while the other side holds the GPUs")]
        return []

    def retry(self, now: float) -> list[SwitchCommand]:
        """The pause again for the actors that have not answered within ``retry_after_s``.

        The first switch is sent while the actors are still starting, before they subscribe, so it is
        re-sent after ``START_RETRY_S`` (a pause repeated to an actor that got it is answered again,
        harmlessly); later ones wait ``retry_after_s``, since a first pause may page-lock gigabytes."""
        interval = self.retry_after_s if self.holder is not None else min(self.retry_after_s, START_RETRY_S)
        if not self.waiting or now - self.sent_s < interval:
            return []
        self.sent_s = now
        side = self._other(self.going_to)
        return [SwitchCommand("pause", side, tuple(sorted(self.waiting)), "no report yet: sent again")]

    # ------------------------------------------------------------------ transitions

    def _advance(self, now: float) -> list[SwitchCommand]:
        if self.is_switching or self.holder == self.wanted:
            return []
        target = self.wanted
        leaving = self._other(target)
        self.going_to, self.started_s, self.sent_s = target, now, now
        targets = tuple(self.members[leaving])
        if leaving in self.managed and targets:
            self.waiting = set(targets)
            return [SwitchCommand("pause", leaving, targets, _reason(target))]
        return self._arrive(now)

    def _arrive(self, now: float) -> list[SwitchCommand]:
        target, previous = self.going_to, self.holder
        if target is None:
            return []
        self.holder, self.going_to = target, None
        self.completed.append(CompletedSwitch(target, self.started_s, now))
        commands = []
        targets = tuple(self.members[target])
        if target in self.managed and previous is not None and targets:  # at the start it is resident already
            commands.append(SwitchCommand("resume", target, targets, _reason(target)))
        return commands + self._advance(now)  # the wanted side may have changed meanwhile

    @staticmethod
    def _other(side: str | None) -> str:
        return ROLLOUT if side == TRAINER else TRAINER


def _reason(target: str) -> str:
    return "the trainer steps on a full buffer" if target == TRAINER else "rollout fills the next buffer"
