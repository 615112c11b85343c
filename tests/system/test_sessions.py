"""Multi-turn sessions with real processes: the session scheduler, its env workers, sticky turns,
ThunderAgent hang/continue on an overfull instance, and environments that fail."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from bus.messages import (
    EnvWorkerReady,
    FinishReason,
    SessionEnd,
    SessionTick,
    TrajectoryDone,
    TurnDone,
    TurnNext,
    TurnStarted,
)
from launch.supervisor import Supervisor
from psrl.config import load_config
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from tests.system.run_checks import read_run

pytestmark = pytest.mark.system

# digit_chain, except that some prompts' environments raise, answer malformed, run past the step
# timeout, or kill their worker process once (its step is then run again on a fresh worker)
FAULTY = """
import os, time
from pathlib import Path
from psrl.envs.digit_chain import DigitChainTask

MARKERS = Path(__file__).parent

class Faulty:
    def __init__(self, env, index): self.env, self.index = env, index
    def reset(self): return self.env.reset()
    def step(self, action):
        kind = self.index % 10
        if kind == 3: raise RuntimeError("tool exploded")
        if kind == 5: return "not a step result"
        if kind == 6: time.sleep(30)
        marker = MARKERS / f"died-{self.index}"
        if kind == 8 and not marker.exists():
            marker.write_text("")
            os.kill(os.getpid(), 9)
        return self.env.step(action)

class FaultyTask:
    name = "faulty_chain"
    def __init__(self, seed): self.task = DigitChainTask(seed)
    def prompt(self, index): return self.task.prompt(index)
    def reward(self, prompt, response): return self.task.reward(prompt, response)
    def make(self, prompt): return Faulty(self.task.make(prompt), prompt.index)
"""

TA = "psrl.rollout_coordination.session_strategy.thunder_agent."
OVERRIDES = [
    "task.name=faulty_chain_env:FaultyTask",
    "trainer.total_steps=3",
    "psrl.staleness_buffer_entries=4",
    "psrl.rollout_n=4",
    "actor.ppo_mini_batch_size=4",
    "topology.n_rollout_instances=1",  # every session piles onto one instance
    "engine.num_kv_blocks=40",  # 640 tokens of KV for 16-32 sessions of up to ~60 tokens
    "env.latency_ms=100",
    "env.step_timeout_s=3",
    TA + "check_interval_in_ms=100",
    TA + "buffer_per_session=20",
    "bus.handshake_timeout_s=120",
]


def test_sessions_pile_up_hang_continue_and_survive_failing_environments(tmp_path, monkeypatch) -> None:
    (tmp_path / "faulty_chain_env.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    config = load_config("agentic", OVERRIDES)
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "sessions"))
    assert sup.run() == 0, sup.end_reason
    events = read_run(sup.run_dir.events).events
    messages = [e.message for e in events]

    ticks = [m for m in messages if isinstance(m, SessionTick)]
    assert any(t.hung for t in ticks), "no session was ever hung"
    assert any(t.continued for t in ticks), "no hung session was continued"

    done = Counter((m.request_id, m.turn) for m in messages if isinstance(m, TurnDone))
    nexts = Counter((m.request_id, m.turn) for m in messages if isinstance(m, TurnNext))
    ends = Counter(m.request_id for m in messages if isinstance(m, SessionEnd))
    assert max(done.values()) == 1 and max(nexts.values()) == 1 and max(ends.values()) == 1  # nothing twice
    for rid, turn in nexts:
        assert (rid, turn - 1) in done, f"session {rid} got turn {turn} without finishing turn {turn - 1}"
    last_turn: dict[int, int] = defaultdict(int)
    for rid, turn in done:
        last_turn[rid] = max(last_turn[rid], turn)
    for rid, turn in done:  # every turn but a session's last was followed by exactly its next turn
        assert (rid, turn + 1) in nexts or turn == last_turn[rid], f"turn {turn} of session {rid} was lost"
    sticky = defaultdict(set)
    for m in messages:
        if isinstance(m, TurnStarted):
            sticky[m.request_id].add(m.instance)
    assert all(len(instances) == 1 for instances in sticky.values())

    trained = [m for m in messages if isinstance(m, TrajectoryDone) and m.finish_reason == FinishReason.STOP]
    assert trained and all(m.num_turns == last_turn[m.request_id] + 1 for m in trained)
    assert any(m.num_turns > 1 for m in trained)
    failures = [m.error for m in messages if isinstance(m, SessionEnd) and m.error]
    assert any("tool exploded" in e for e in failures)
    assert any("StepResult" in e for e in failures)
    assert any("timed out" in e for e in failures)
    died = [m for m in messages if isinstance(m, SessionEnd) and not m.error and m.request_id // 4 % 10 == 8]
    assert died, "sessions whose env worker was killed were not retried to their end"
    replaced = [m for m in messages if isinstance(m, EnvWorkerReady) and m.replaced_pid]
    assert replaced and all(m.pid != m.replaced_pid for m in replaced)  # each replacement said it was ready
    sessions = check_invariants(events, config.psrl.staleness).sessions
    assert not (sessions.lost or sessions.applied_twice or sessions.broken), sessions
    assert sessions.num_finished and sum(sessions.failed.values())  # failures counted by their reason
    failed_groups = {m.request_id // 4 for m in messages if isinstance(m, SessionEnd) and m.error}
    assert not failed_groups & {m.request_id // 4 for m in trained}  # a failed session's group is never trained

    report = replay_run(sup.run_dir.path, ["sessions", "ledger", "routing"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, checker.name
    assert report.checkers[0].agreement.num_agree > 0
