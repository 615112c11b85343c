"""The multi-turn sessions' promises, checked from the event log alone (pure).

    lost          a session the scheduler took over (its first turn handed over, ``TurnDone``) that
                  never ended, although the run is done with its prompt group (consumed, or its
                  staleness window passed): no ``SessionEnd`` (done, or failed with its reason),
                  no ``SessionGone`` and no ``TrajectoryDone``
    applied twice a session's turn answered twice (two different ``TurnNext`` for one turn), a
                  session ended twice differently (two different ``SessionEnd``), or one
                  environment step answered twice (two successful ``EnvStepDone`` for one turn: the
                  step ran again after its answer was already recorded). The same answer sent
                  again (to a restarted router, which takes each once) is no second application:
                  the response check below proves the router took it once.
    broken        a finished session whose trained response is not exactly its turns' tokens
                  (``TurnDone``) and the environment's answers (``TurnNext``) in order, each
                  branch's cut applied first (``TurnNext.cut_to``: an agent that edited its
                  history goes on from the kept prefix), whose trained prompt is not what the
                  last branch inside the prompt kept (``TurnNext.prompt_keep``), or whose next
                  turn's observation is not the recorded environment answer: a continuation after a
                  fault that did not continue from exactly its tokens

A session failed by a documented rule (an environment error or timeout, a step whose worker died
past ``env.worker_retry_limit``, a trajectory the router gave up) is not a violation; its reason
is counted in ``failed``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bus.messages import EnvStepDone, FinishReason, SessionEnd, SessionGone, TrajectoryDone, TurnDone, TurnNext


@dataclass
class SessionReport:
    lost: list[int] = field(default_factory=list)
    applied_twice: list[str] = field(default_factory=list)
    broken: list[int] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)  # reason -> sessions failed by a documented rule
    num_sessions: int = 0
    num_finished: int = 0
    num_checks: int = 0


@dataclass
class SessionFacts:
    prompt_of: dict[int, int] = field(default_factory=dict)  # session (request id) -> prompt group
    turns: dict[int, dict[int, np.ndarray]] = field(default_factory=lambda: defaultdict(dict))  # rid -> turn -> ids
    # rid -> turn -> the observations of every TurnNext of that turn
    nexts: dict[int, dict[int, list[np.ndarray]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    cuts: dict[tuple[int, int], int] = field(default_factory=dict)  # (rid, turn) -> its TurnNext's cut_to
    prompt_keeps: dict[tuple[int, int], int] = field(default_factory=dict)  # (rid, turn) -> its prompt_keep
    answers: Counter[tuple[int, int]] = field(default_factory=Counter)  # (rid, turn) -> successful env answers
    answer_of: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    ends: dict[int, list[SessionEnd]] = field(default_factory=lambda: defaultdict(list))
    gone: set[int] = field(default_factory=set)
    trajectories: dict[int, TrajectoryDone] = field(default_factory=dict)

    def observe(self, msg: Any) -> None:
        if isinstance(msg, TurnDone):
            if msg.turn == 0:
                self.prompt_of.setdefault(msg.request_id, msg.prompt_id)
            self.turns[msg.request_id][msg.turn] = np.asarray(msg.token_ids)
        elif isinstance(msg, TurnNext):
            self.nexts[msg.request_id][msg.turn].append(np.asarray(msg.observation_token_ids))
            self.cuts[(msg.request_id, msg.turn)] = msg.cut_to
            self.prompt_keeps[(msg.request_id, msg.turn)] = msg.prompt_keep
        elif isinstance(msg, EnvStepDone) and not msg.error:
            self.answers[(msg.request_id, msg.turn)] += 1
            self.answer_of[(msg.request_id, msg.turn)] = np.asarray(msg.observation_token_ids)
        elif isinstance(msg, SessionEnd):
            self.ends[msg.request_id].append(msg)
        elif isinstance(msg, SessionGone):
            self.gone.add(msg.request_id)
        elif isinstance(msg, TrajectoryDone):
            self.trajectories[msg.request_id] = msg


def check_sessions(facts: SessionFacts, settled: set[int]) -> SessionReport:
    """``settled``: the prompt groups the run is done with (``invariants._settled``)."""
    report = SessionReport(num_sessions=len(facts.prompt_of))
    for rid, prompt_id in facts.prompt_of.items():
        report.num_checks += 1
        ended = rid in facts.ends or rid in facts.gone or rid in facts.trajectories
        if not ended and prompt_id in settled:
            report.lost.append(rid)
        _count_failure(facts, rid, report)
    _check_twice(facts, report)
    for rid in facts.prompt_of:
        if _finished(facts, rid):
            report.num_finished += 1
            report.num_checks += 1
            if not _continuous(facts, rid):
                report.broken.append(rid)
    report.lost.sort()
    report.broken.sort()
    return report


def _count_failure(facts: SessionFacts, rid: int, report: SessionReport) -> None:
    errors = [end.error for end in facts.ends.get(rid, []) if end.error]
    done = facts.trajectories.get(rid)
    if errors:
        report.failed[_reason(errors[0])] += 1
    elif done is not None and done.finish_reason == FinishReason.ERROR:
        report.failed[_reason(done.error)] += 1


def _reason(error: str) -> str:
    """The kind of failure, without its particulars (the worker, the seconds)."""
    return error.split(";", maxsplit=1)[0].split(" after ", maxsplit=1)[0][:60]


def _check_twice(facts: SessionFacts, report: SessionReport) -> None:
    for rid, by_turn in facts.nexts.items():
        for turn, observations in by_turn.items():
            report.num_checks += 1
            answers = {tuple(o.tolist()) for o in observations}
            if len(answers) > 1:
                report.applied_twice.append(f"{rid}: turn {turn} answered {len(answers)} different ways")
    for rid, ends in facts.ends.items():
        report.num_checks += 1
        if len(set(ends)) > 1:
            report.applied_twice.append(f"{rid}: ended {len(set(ends))} different ways")
    for (rid, turn), count in facts.answers.items():
        report.num_checks += 1
        if count > 1:
            report.applied_twice.append(f"{rid}: env step of turn {turn} answered {count} times")


def _finished(facts: SessionFacts, rid: int) -> bool:
    ends = facts.ends.get(rid, [])
    done = facts.trajectories.get(rid)
    return bool(ends) and not ends[-1].error and done is not None and done.finish_reason == FinishReason.STOP


def _continuous(facts: SessionFacts, rid: int) -> bool:
    """The response is turn 0, answer 1, turn 1, ... exactly (each branch cut back before its answer);
    each answer the one the environment gave; the prompt kept what the last branch inside it kept."""
    num_turns = facts.ends[rid][-1].num_turns
    turns, nexts = facts.turns.get(rid, {}), facts.nexts.get(rid, {})
    expected = np.zeros(0, np.int64)
    prompt_keep = -1
    for turn in range(num_turns):
        if turn > 0:
            observations = nexts.get(turn, [])
            answer = facts.answer_of.get((rid, turn - 1))
            if not observations or answer is None or not np.array_equal(observations[-1], answer):
                return False
            cut_to = facts.cuts.get((rid, turn), -1)
            if cut_to > len(expected):
                return False
            expected = np.concatenate([expected if cut_to < 0 else expected[:cut_to], observations[-1]])
            cut_prompt_to = facts.prompt_keeps.get((rid, turn), -1)
            prompt_keep = cut_prompt_to if cut_prompt_to >= 0 else prompt_keep
        if turn not in turns:
            return False
        expected = np.concatenate([expected, turns[turn]])
    done = facts.trajectories[rid]
    return done.prompt_keep == prompt_keep and np.array_equal(np.asarray(done.token_ids), expected)
