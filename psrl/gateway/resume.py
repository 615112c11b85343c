"""The resume rule: an agent session rebuilt by a restarted session scheduler, met by its re-run agent (pure).

An agent runs in an env worker of the session scheduler and dies with it. The restarted scheduler
rebuilds the session's turns from the event log (``psrl.flows.session_recovery``) and runs the
agent again from the start. Its gateway record starts empty, so each of the agent's calls is
placed as usual (TITO: the exact tokens of the turns it rebuilt, then the new messages' tokens) and
then met with the logged turns (``place``), by the turn's index:

* **replay**: the turn is logged with the same observation tokens (what the call appends) and the
  same cut (a branch: the response and prompt tokens it kept, ``psrl.gateway.branch``), and its tokens are
  known: it is answered from the log; nothing reaches the router, nothing is logged.
* **wait**: the turn was sent to the router with the same observation, its tokens are not in yet
  (it was generating when the scheduler died, or the restored scheduler sent it again because the
  router had not placed it): the call waits for the router's ``TurnDone``.
* **send**: the agent's answer (the observation) is logged but the turn was never sent (the old
  scheduler died in between, or held it for a hung session): it is sent now, not logged again.
* **new**: past the log: a turn like any other. (A turn the router generated although its call's
  tokens never reached the log, the old scheduler dying as it sent it, is a **replay** unchecked.)
* anything else (``ResumeDivergedError``): the re-run agent asked for other tokens than its first run
  (an agent that is not deterministic given the model's answers). The logged turn cannot be taken
  back from the router, so the session fails with the session and turn named.

So a turn is generated once, however often its agent is re-run, and each call gets its answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from psrl.gateway.branch import NO_CUT, CutPoint

Step = Literal["replay", "wait", "send", "new"]


class ResumeDivergedError(ValueError):
    """A re-run agent's call does not repeat the logged turn it should repeat."""


@dataclass
class TurnLog:
    """An agent session's turns as its scheduler knows them (index = turn; turn 0 was generated from
    the row): kept as they happen, or rebuilt from the event log by a restarted scheduler."""

    observations: list[list[int]]  # per turn: the tokens its call appended (turn 0: none)
    sent: list[bool]  # per turn: sent to the router (turn 0: always)
    finishes: list[int] = field(default_factory=list)  # per generated turn: its finish reason
    logprobs: list[list[float] | None] = field(default_factory=list)  # per generated turn, where logged
    cuts: list[CutPoint | None] = field(default_factory=list)  # per turn: its cut (NO_CUT: none; None: not logged)

    @property
    def num_turns(self) -> int:
        return len(self.observations)

    def generated(self, finish: int, logprobs: list[float] | None) -> None:
        """A turn's tokens came (they are the session's actions; here, how it ended and its log-probs)."""
        self.finishes.append(finish)
        self.logprobs.append(logprobs)

    def sent_turn(self, turn: int) -> None:
        if turn < self.num_turns:
            self.sent[turn] = True

    def asked(self, turn: int, observation: list[int], cut: CutPoint = NO_CUT) -> None:
        """The agent asked for ``turn`` with ``observation`` (after the cut ``cut``): logged, not sent yet."""
        if turn == self.num_turns:
            self.observations.append(observation)
            self.sent.append(False)
        while len(self.cuts) < self.num_turns:
            self.cuts.append(None)
        if self.cuts[turn] is None:
            self.cuts[turn] = cut

    def cut_of(self, turn: int) -> CutPoint | None:
        return self.cuts[turn] if turn < len(self.cuts) else None


def place(
    log: TurnLog, session_id: str, turn: int, new_tokens: Sequence[int], num_generated: int, cut: CutPoint = NO_CUT
) -> Step:
    """What a re-run agent's call for ``turn`` (the cut ``cut``: its ``(cut_to, prompt_keep)``, then
    appending ``new_tokens``) gets, given the log and the ``num_generated`` turns whose tokens are known."""
    if turn >= log.num_turns:
        # a turn generated whose call's tokens never reached the log (the old scheduler died as it sent
        # it): the router's tokens answer it; its observation cannot be checked
        return "replay" if turn < num_generated else "new"
    logged = log.observations[turn]
    if list(new_tokens) != logged:
        raise ResumeDivergedError(
            f"session {session_id} turn {turn}: the agent, run again, appends {len(new_tokens)} tokens "
            f"that differ from the {len(logged)} its first run logged (first difference at token "
            f"{_first_difference(new_tokens, logged)}); an agent that runs again (its worker or scheduler "
            "restarted) must repeat its calls given the same answers"
        )
    logged_cut = log.cut_of(turn)
    if logged_cut is not None and logged_cut != cut:
        raise ResumeDivergedError(
            f"session {session_id} turn {turn}: the agent, run again, branches with the cut (cut_to, prompt_keep) "
            f"{cut} where its first run cut {logged_cut} (-1: no cut); an agent that runs again "
            "must repeat its calls given the same answers"
        )
    if turn < num_generated:
        return "replay"
    return "wait" if log.sent[turn] else "send"


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
