"""The agent runner against a live gateway: a callable agent and a black-box command agent (its own
process, told the session's endpoint by OPENAI_BASE_URL, the row on stdin, its reward on stdout),
and the failures that fail only their session: an exception, a non-zero exit, no reward."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from psrl.envs.host import StepRequest
from psrl.gateway.local import EngineGateway
from psrl.gateway.runner import AgentRunner, last_line_score, score_of
from tests.gateway.conftest import DEMO, TOKEN

COMMAND_AGENT = """
import json, os, sys
import openai
row = json.load(sys.stdin)
client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
reply = client.chat.completions.create(model="psrl", messages=row["messages"], max_tokens=4)
print("some log line")
print(json.dumps({"score": 0.25, "turns": 1, "session": os.environ["PSRL_SESSION_ID"]}))
"""
CALLABLE_AGENT = """
def run(client, row):
    answer = client.chat.completions.create(model="psrl", messages=row["messages"], max_tokens=4)
    if row["answer"] == "boom":
        raise ValueError("the agent broke")
    return {"score": 0.5, "acc": 1.0}
"""


def runner(tmp_path: Path, gateway: EngineGateway, **agent: str) -> AgentRunner:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps({"messages": [{"role": "user", "content": f"sum {i} 1"}], "answer": a})
            for i, a in enumerate(["2", "boom"])
        )
    )
    spec = {
        "entry": "",
        "command": "",
        "dataset": str(rows),
        "timeout_s": 60,
        "model_dir": DEMO,
        "chat_template": "auto",
        "base_url": gateway.url,
        "token": TOKEN,
        **agent,
    }
    return AgentRunner(spec)


def test_a_command_agent_is_a_black_box_with_its_reward_on_stdout(tmp_path: Path, gateway: EngineGateway) -> None:
    script = tmp_path / "agent.py"
    script.write_text(COMMAND_AGENT)
    reply = runner(tmp_path, gateway, command=f"{sys.executable} {script}").run(StepRequest(7001, 0, 0, []))
    assert reply.error == "" and reply.done and reply.reward == 0.25
    assert len(gateway.gateway.record("7001")["trajectories"][0]["turns"]) == 1
    failing = runner(tmp_path, gateway, command=f"{sys.executable} -c 'import sys; sys.exit(3)'")
    assert "exited with 3" in failing.run(StepRequest(7002, 0, 0, [])).error
    silent = runner(tmp_path, gateway, command="true").run(StepRequest(7003, 0, 0, []))
    assert "printed no reward" in silent.error


def test_a_callable_agent_and_its_exception(tmp_path: Path, gateway: EngineGateway) -> None:
    (tmp_path / "my_agent.py").write_text(CALLABLE_AGENT)
    agent = runner(tmp_path, gateway, entry=f"{tmp_path / 'my_agent.py'}:run")
    ok = agent.run(StepRequest(7004, 0, 0, []))
    assert ok.error == "" and (ok.reward, ok.acc) == (0.5, 1.0)
    broken = agent.run(StepRequest(7005, 1, 0, []))
    assert not broken.done and "ValueError: the agent broke" in broken.error


def test_rewards_are_numbers_or_scores() -> None:
    assert score_of(1) == (1.0, 1.0) and score_of({"score": 0.5, "acc": 0}) == (0.5, 0.0)
    assert last_line_score("log\n0.75\n\n") == (0.75, 0.75)
    for bad in ("yes", None, True, {"acc": 1}):
        with pytest.raises(RuntimeError):
            score_of(bad)


def test_an_agent_command_dies_with_its_worker() -> None:
    """A dead scheduler's agents must not call on: a command started as the runner starts it dies with
    its parent (the worker), so a restarted scheduler's re-run agent is the session's only client."""
    import os
    import signal
    import subprocess
    import sys
    import time

    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; from psrl.gateway.runner import die_with_parent; "
            "child = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent); "
            "print(child.pid, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    with worker, worker.stdout:
        agent = int(worker.stdout.readline())
        os.kill(worker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(agent):
        time.sleep(0.02)
    assert not _alive(agent)


def _alive(pid: int) -> bool:

    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
