"""The session scheduler with its gateway SIGKILLed mid-turn during a `psrl launch` of openai-SDK agents:
the supervisor restarts it, the replacement rebuilds the agent sessions from the event log and runs
their agents again, whose calls get the logged turns back (or wait for the one generating); the run
finishes with no session lost, no turn applied twice and `psrl replay --check all` agreeing."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bus.messages import ActorRestarted, SessionEnd, TurnDone, TurnNext
from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from tests.system.run_checks import read_run

pytestmark = [pytest.mark.system, pytest.mark.chaos]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_openai"

# The example agent, whose client kills its own session scheduler (its worker's parent) while a call
# is in flight: the first agent to make its 3rd call (turn 2: turn 1 is logged, to be replayed), 20 ms
# after sending it; then, once that replacement has served a while, the first to make its 2nd call,
# as soon as the gateway reports the call in flight (its turn sent to the router, or held). Each
# kill happens once (a marker file); the killer's session id is written into it.
KILLING = """
import importlib.util, os, signal, threading, time
import httpx

spec = importlib.util.spec_from_file_location("example_agent", "{example}/agent.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
KILLS = [("{marks}/kill-1", 3, 0.02, None), ("{marks}/kill-2", 2, 0.0, "{marks}/kill-1")]


class Killing:
    def __init__(self, client):
        self.client, self.calls = client, 0
        self.chat = self.completions = self
        self.sid = str(client.base_url).rstrip("/").removesuffix("/v1").rsplit("/", 1)[1]

    def create(self, **kw):
        self.calls += 1
        for mark, at_call, delay, after in KILLS:
            if at_call == self.calls and (after is None or _older(after, 3.0)) and _claim(mark, self.sid):
                kill = _kill_in_flight if after else _kill_after
                threading.Thread(target=kill, args=(self.client, delay), daemon=True).start()
                break
        return self.client.chat.completions.create(**kw)


def _kill_after(client, delay):
    time.sleep(delay)
    os.kill(os.getppid(), signal.SIGKILL)


def _kill_in_flight(client, delay):
    session = str(client.base_url).rstrip("/").removesuffix("/v1")
    headers = {{"Authorization": f"Bearer {{client.api_key}}"}}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        got = httpx.get(session, headers=headers)
        if got.status_code != 200 or got.json()["in_flight"]:  # in flight (or, rarely, already over)
            break
        time.sleep(0.001)
    os.kill(os.getppid(), signal.SIGKILL)


def _older(path, seconds):
    return os.path.exists(path) and time.time() - os.path.getmtime(path) > seconds


def _claim(mark, sid):
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, sid.encode())
    os.close(fd)
    return True


def run(client, row):
    return example.run(Killing(client), row)
"""


def test_a_scheduler_killed_mid_turn_resumes_its_agent_sessions_and_loses_none(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    agent = tmp_path / "killing_agent.py"
    agent.write_text(KILLING.format(example=EXAMPLE, marks=marks))
    overrides = [f"agent.entry={agent}:run", "trainer.total_steps=6", "bus.handshake_timeout_s=180"]
    config = load_config(str(EXAMPLE / "config.yaml"), overrides)
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "agent-restart"))
    assert sup.run() == EXIT_OK, sup.end_reason
    events = read_run(sup.run_dir.events).events
    messages = [e.message for e in events]
    restarts = [m for m in messages if isinstance(m, ActorRestarted) and m.actor == "session"]
    killers = [int((marks / f"kill-{k}").read_text()) for k in (1, 2) if (marks / f"kill-{k}").exists()]
    assert len(restarts) == len(killers) == 2, (restarts, killers)

    sessions = check_invariants(events, config.psrl.staleness).sessions
    assert not (sessions.lost or sessions.applied_twice or sessions.broken), sessions
    assert not [r for r in sessions.failed if "scheduler" in r or "history" in r or "agent, run again" in r]
    assert_each_turn_once(messages)
    ends = {m.request_id: m for m in messages if isinstance(m, SessionEnd)}
    for killer in killers:  # the agent whose call was in flight at the kill got its answers and its reward
        assert killer in ends and not ends[killer].error, ends.get(killer)

    met = _log_records(sup.run_dir.path / "logs" / "session.jsonl", "agent call met a logged turn")
    steps = {(r["request_id"], r["turn"]): r["step"] for r in met}
    assert steps.get((killers[0], 1)) == "replay", steps  # the first killer's turn 1: from the log
    # the second killer's call was in flight at the gateway: its turn generated (replayed from the log),
    # generating (waited for) or held (sent by the replacement); never generated again
    ended_first = ends[killers[1]].request_id in _ended_before(events, restarts[1])
    assert ended_first or steps.get((killers[1], 1)) in ("replay", "wait", "send"), steps
    report = replay_run(sup.run_dir.path, ["all"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])
    assert {c.name: c.agreement.num_agree for c in report.checkers}["sessions"] > 0


def assert_each_turn_once(messages: list[Any]) -> None:
    """Every turn of every session generated once (a turn handed over again carries the same tokens) and
    asked for once (one observation per turn)."""
    generated: dict[tuple[int, int], set[bytes]] = defaultdict(set)
    asked: dict[tuple[int, int], set[bytes]] = defaultdict(set)
    for m in messages:
        if isinstance(m, TurnDone):
            generated[(m.request_id, m.turn)].add(np.asarray(m.token_ids, np.int32).tobytes())
        elif isinstance(m, TurnNext):
            asked[(m.request_id, m.turn)].add(np.asarray(m.observation_token_ids, np.int32).tobytes())
    assert all(len(v) == 1 for v in generated.values()) and all(len(v) == 1 for v in asked.values())
    assert any(turn >= 2 for _, turn in generated)


def _ended_before(events: list[Any], restart: ActorRestarted) -> set[int]:
    """Sessions ended before ``restart`` was logged."""
    ended: set[int] = set()
    for event in events:
        if event.message is restart:
            return ended
        if isinstance(event.message, SessionEnd):
            ended.add(event.message.request_id)
    return ended


def _log_records(path: Path, event: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return [r for r in records if r.get("event") == event]
