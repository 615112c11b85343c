"""An openai-SDK agent trained end to end through the session gateway (real processes, real HTTP):
the example agent runs in env workers, every turn goes through the router, the gateway's TITO record
of each session equals what reached the trainer token for token, failing agents fail only their
sessions, and the replay's checkers agree with every recorded decision."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bus.messages import FinishReason, SessionEnd, TrajectoryDone, TurnDone
from launch.supervisor import Supervisor
from psrl.config import load_config
from psrl.gateway.agent_task import AgentTask
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from tests.system.run_checks import read_run

pytestmark = pytest.mark.system
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_openai"

# the example agent, failing on purpose for some rows, and keeping the gateway's record of its session
RECORDING = """
import importlib.util, json
from pathlib import Path
import httpx

spec = importlib.util.spec_from_file_location("example_agent", "{example}/agent.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

def run(client, row):
    if int(row["answer"]) % 9 == 0:
        raise RuntimeError("planned failure")
    reward = example.run(client, row)
    session = str(client.base_url).rstrip("/").removesuffix("/v1")
    record = httpx.get(session, headers={{"Authorization": f"Bearer {{client.api_key}}"}}).json()
    Path("{records}", session.rsplit("/", 1)[1] + ".json").write_text(json.dumps(record))
    return reward
"""


def test_an_openai_agent_trains_through_the_gateway_with_exact_tokens(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    agent = tmp_path / "recording_agent.py"
    agent.write_text(RECORDING.format(example=EXAMPLE, records=records))
    overrides = [f"agent.entry={agent}:run", "trainer.total_steps=2", "topology.warm_spares=0"]
    config = load_config(str(EXAMPLE / "config.yaml"), [*overrides, "bus.handshake_timeout_s=120"])
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "agent"))
    assert sup.run() == 0, sup.end_reason
    events = read_run(sup.run_dir.events).events
    messages = [e.message for e in events]

    ends = [m for m in messages if isinstance(m, SessionEnd)]
    assert max(Counter(m.request_id for m in ends).values()) == 1
    assert any("agent failed: RuntimeError: planned failure" in m.error for m in ends)
    assert any(not m.error for m in ends)
    done = Counter((m.request_id, m.turn) for m in messages if isinstance(m, TurnDone))
    assert max(done.values()) == 1  # no turn applied twice

    task = AgentTask.from_config(config)
    trained = [m for m in messages if isinstance(m, TrajectoryDone) and m.finish_reason == FinishReason.STOP]
    checked = 0
    for traj in trained:
        path = records / f"{traj.request_id}.json"
        if not path.exists():  # its agent was still fetching the record when the run ended
            continue
        [recorded] = json.loads(path.read_text())["trajectories"]
        prompt = list(task.prompt(traj.prompt_id).token_ids)
        assert recorded["token_ids"] == prompt + np.asarray(traj.token_ids).tolist()
        mask = np.ones(len(traj.token_ids)) if traj.loss_mask is None else np.asarray(traj.loss_mask)
        assert recorded["loss_mask"] == [0] * len(prompt) + mask.astype(int).tolist()
        assert len(recorded["turns"]) == traj.num_turns
        # every turn's log-probs (what a call asking logprobs is answered) are the trainer's, token for token
        turn_logprobs = [lp for turn in recorded["turns"] for lp in turn["logprobs"]]
        assert turn_logprobs == pytest.approx(np.asarray(traj.logprobs)[mask.astype(bool)].tolist(), abs=1e-6)
        checked += 1
    assert checked >= 4 and any(t.num_turns > 1 for t in trained)

    sessions = check_invariants(events, config.psrl.staleness).sessions
    assert not (sessions.lost or sessions.applied_twice or sessions.broken), sessions
    report = replay_run(sup.run_dir.path, ["all"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, checker.name
