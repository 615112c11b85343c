"""History edits in a training run, through the official openai client: ``psrl launch`` of the worked
example with an agent that drops its last reply and says something else (mini-swe-agent's format
errors do this), then changes the system prompt, then goes on from its branch.

The dropped reply branches the session: the router's trajectory is cut back to the longest common
token prefix (``TurnNext.cut_to``, the abandoned tail's size in ``num_cut``) and the branch is what
the trainer gets, equal to the gateway's record of the session's current trajectory token for token
(loss mask and log-probs alike), while the record keeps both trajectories. The changed system prompt
reaches into the row's prompt (the prompt group's), which a run cannot cut: 409 ``history_edited``
naming the session and turn, and nothing changes. The run finishes; replay agrees 100%."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bus.messages import FinishReason, SessionEnd, TrajectoryDone, TurnDone, TurnNext
from launch.supervisor import Supervisor
from psrl.config import load_config
from psrl.gateway.agent_task import AgentTask
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from tests.system.run_checks import read_run

pytestmark = [pytest.mark.system, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_openai"

EDITING_AGENT = """
import json
from pathlib import Path
import httpx, openai

def _ask(client, row, messages):
    answer = client.chat.completions.create(model="psrl", messages=messages, tools=row["tools"], max_tokens=12)
    message = answer.choices[0].message
    out = [message.model_dump(exclude_none=True)]
    for call in message.tool_calls or []:
        out.append({{"role": "tool", "tool_call_id": call.id, "content": "3"}})
    return out

def run(client, row):
    notes = {{}}
    try:
        first = [*row["messages"], *_ask(client, row, row["messages"])]
        asked = [*first, {{"role": "user", "content": "again"}}]
        _ask(client, row, asked)  # its reply is dropped below
        dropped = [*asked, {{"role": "user", "content": "answer as ans n"}}]
        branch = [*dropped, *_ask(client, row, dropped)]
        try:
            edited = [{{"role": "system", "content": "be short"}}, *row["messages"][1:]]
            client.chat.completions.create(model="psrl", messages=edited, tools=row["tools"])
        except openai.ConflictError as refused:
            notes["refused"] = refused.body
        _ask(client, row, [*branch, {{"role": "user", "content": "ok"}}])
    except openai.ConflictError:  # the session was ended (a surplus child): cancellation
        return 0.0
    session = str(client.base_url).rstrip("/").removesuffix("/v1")
    record = httpx.get(session, headers={{"Authorization": f"Bearer {{client.api_key}}"}}).json()
    record["notes"] = notes
    Path("{records}", session.rsplit("/", 1)[1] + ".json").write_text(json.dumps(record))
    return 1.0
"""


def test_a_dropped_reply_branches_a_run_s_session_and_the_branch_is_trained(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    agent = tmp_path / "editing_agent.py"
    agent.write_text(EDITING_AGENT.format(records=records))
    overrides = [f"agent.entry={agent}:run", "trainer.total_steps=2", "topology.warm_spares=0"]
    config = load_config(str(EXAMPLE / "config.yaml"), [*overrides, "bus.handshake_timeout_s=120"])
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "edits"))
    assert sup.run() == 0, sup.end_reason
    events = read_run(sup.run_dir.events).events
    messages = [e.message for e in events]
    assert max(Counter((m.request_id, m.turn) for m in messages if isinstance(m, TurnDone)).values()) == 1
    assert max(Counter(m.request_id for m in messages if isinstance(m, SessionEnd)).values()) == 1
    cuts = [m for m in messages if isinstance(m, TurnNext) and m.cut_to >= 0]
    assert cuts and all(m.num_cut > 0 and m.turn == 2 for m in cuts)  # the abandoned tails, in the log

    task = AgentTask.from_config(config)
    trained = [m for m in messages if isinstance(m, TrajectoryDone) and m.finish_reason == FinishReason.STOP]
    checked = 0
    for traj in trained:
        path = records / f"{traj.request_id}.json"
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        refused = record["notes"]["refused"]
        assert refused["code"] == "history_edited" and f"session {traj.request_id} turn 0:" in refused["message"]
        assert len(record["trajectories"]) == 2 and record["current"] == 1  # both recorded; the branch is current
        branch = record["trajectories"][1]
        assert branch["branch_of"] == 0 and 0 < branch["branch_at"] < len(record["trajectories"][0]["token_ids"])
        prompt = list(task.prompt(traj.prompt_id).token_ids)
        assert branch["token_ids"] == prompt + np.asarray(traj.token_ids).tolist()  # the engine's, byte for byte
        mask = np.asarray(traj.loss_mask)
        assert branch["loss_mask"] == [0] * len(prompt) + mask.astype(int).tolist()
        turn_logprobs = [lp for turn in branch["turns"] for lp in turn["logprobs"]]
        assert turn_logprobs == pytest.approx(np.asarray(traj.logprobs)[mask.astype(bool)].tolist(), abs=1e-6)
        assert traj.num_turns == 4  # every generated turn counts, the abandoned one too
        checked += 1
    assert checked >= 2

    sessions = check_invariants(events, config.psrl.staleness).sessions
    assert not (sessions.lost or sessions.applied_twice or sessions.broken), sessions
    report = replay_run(sup.run_dir.path, ["all"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, checker.name
        assert checker.agreement.num_agree > 0 or checker.name != "sessions", checker.name
