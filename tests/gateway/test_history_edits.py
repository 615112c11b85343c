"""History edits in a training run, through the official openai client: ``psrl launch`` of the worked
example with an agent that drops its last reply and says something else (mini-swe-agent's format
errors do this), then drops its first reply, then changes the system prompt, then goes on from its
branch.

Each edit branches the session. The dropped last reply cuts the router's trajectory back to the
longest common token prefix (``TurnNext.cut_to``, the abandoned tail's size in ``num_cut``); the
dropped first reply and the changed system prompt end the common prefix inside the row's prompt, so
the trajectory's prompt is cut to it (``TurnNext.prompt_keep``), its whole response dropped and the
rest of the call's prompt appended as an untrained observation. What the trainer gets is the branch:
the kept prompt prefix (``TrajectoryDone.prompt_keep``), then observations and turns, equal to the
gateway's record of the session's current trajectory token for token (loss mask and log-probs
alike), while the record keeps every trajectory. The run finishes; replay agrees 100%."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bus.messages import FinishReason, SessionEnd, TrajectoryDone, TurnDone, TurnNext
from launch.supervisor import Supervisor
from psrl.config import load_config
from psrl.coordination.chunks import Chunk
from psrl.coordination.groups import PromptGroup
from psrl.flows.train_data import train_data, trajectories_from
from psrl.gateway.agent_task import AgentTask
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from psrl.tasks.base import Prompt, Reward
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
    try:
        first = [*row["messages"], *_ask(client, row, row["messages"])]
        asked = [*first, {{"role": "user", "content": "again"}}]
        _ask(client, row, asked)  # its reply is dropped below
        dropped = [*asked, {{"role": "user", "content": "answer as ans n"}}]
        _ask(client, row, dropped)  # a branch of the response
        no_first = [*row["messages"], {{"role": "user", "content": "answer as ans n"}}]
        _ask(client, row, no_first)  # the first reply dropped: a branch inside the row's prompt
        edited = [{{"role": "system", "content": "be short"}}, *no_first[1:]]
        branch = [*edited, *_ask(client, row, edited)]  # a changed system prompt: inside the prompt again
        _ask(client, row, [*branch, {{"role": "user", "content": "ok"}}])
    except openai.ConflictError:  # the session was ended (a surplus child): cancellation
        return 0.0
    session = str(client.base_url).rstrip("/").removesuffix("/v1")
    record = httpx.get(session, headers={{"Authorization": f"Bearer {{client.api_key}}"}}).json()
    Path("{records}", session.rsplit("/", 1)[1] + ".json").write_text(json.dumps(record))
    return 1.0
"""


def test_edits_of_the_history_and_of_the_row_s_prompt_branch_a_run_s_session_and_the_branch_is_trained(
    tmp_path: Path,
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    agent = tmp_path / "editing_agent.py"
    agent.write_text(EDITING_AGENT.format(records=records))
    overrides = [f"agent.entry={agent}:run", "trainer.total_steps=2", "topology.warm_spares=0", "env.max_turns=6"]
    config = load_config(str(EXAMPLE / "config.yaml"), [*overrides, "bus.handshake_timeout_s=120"])
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "edits"))
    assert sup.run() == 0, sup.end_reason
    events = read_run(sup.run_dir.events).events
    messages = [e.message for e in events]
    assert max(Counter((m.request_id, m.turn) for m in messages if isinstance(m, TurnDone)).values()) == 1
    assert max(Counter(m.request_id for m in messages if isinstance(m, SessionEnd)).values()) == 1
    cuts = [m for m in messages if isinstance(m, TurnNext) and m.cut_to >= 0]
    assert cuts and all(m.num_cut > 0 for m in cuts)  # the abandoned tails, in the log
    assert {m.turn for m in cuts if m.prompt_keep < 0} == {2}  # the dropped last reply: a response cut
    assert {m.turn for m in cuts if m.prompt_keep >= 0} == {3, 4}  # the row's prompt edited: prompt cuts

    task = AgentTask.from_config(config)
    trained = [m for m in messages if isinstance(m, TrajectoryDone) and m.finish_reason == FinishReason.STOP]
    checked = 0
    for traj in trained:
        path = records / f"{traj.request_id}.json"
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        assert record["current"] == len(record["trajectories"]) - 1 >= 3  # every trajectory recorded
        branch = record["trajectories"][record["current"]]
        prompt = list(task.prompt(traj.prompt_id).token_ids)
        assert 0 < traj.prompt_keep < len(prompt) and branch["branch_of"] is not None
        _assert_trained_as_recorded(traj, np.asarray(prompt, np.int32), branch)
        assert traj.num_turns == 6  # every generated turn counts, the abandoned ones too
        checked += 1
    assert checked >= 2

    sessions = check_invariants(events, config.psrl.staleness).sessions
    assert not (sessions.lost or sessions.applied_twice or sessions.broken), sessions
    report = replay_run(sup.run_dir.path, ["all"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, checker.name
        assert checker.agreement.num_agree > 0 or checker.name != "sessions", checker.name


def _assert_trained_as_recorded(traj: TrajectoryDone, prompt: np.ndarray, branch: dict[str, Any]) -> None:
    """The trainer's trajectory (built as the coordinator builds it) is the branch, byte for byte: the
    kept prompt prefix, then the observations and turns, with the record's loss mask and log-probs."""
    group = PromptGroup(traj.prompt_id, Prompt(traj.prompt_id, "k", "t", "a"), prompt)
    group.results, group.rewards, group.winners = (
        {traj.request_id: traj},
        {traj.request_id: Reward(1, 1)},
        (traj.request_id,),
    )
    [trained] = trajectories_from(train_data(Chunk(0, 0, 1, (traj.prompt_id,)), [group]), 1)
    tokens = [*trained.prompt_token_ids.tolist(), *trained.response_token_ids.tolist()]
    assert tokens == branch["token_ids"]  # the engine's, byte for byte
    mask = trained.loss_mask.astype(int).tolist()
    assert [0] * len(trained.prompt_token_ids) + mask == branch["loss_mask"]
    turn_logprobs = [lp for turn in branch["turns"] for lp in turn["logprobs"]]
    generated = np.asarray(trained.rollout_log_probs)[np.asarray(mask, bool)]
    assert turn_logprobs == pytest.approx(generated.tolist(), abs=1e-6)
