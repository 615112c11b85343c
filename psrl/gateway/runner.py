"""Runs agents in the session scheduler's env worker processes (``actors.env_pool``).

An agent session starts when its first turn is generated: the worker gets the session's step of
turn 0, opens the session at the gateway (``POST /sessions`` with the row's opening messages and
the prompt's tokens, so the first turn answers the agent's first call), runs the agent and answers
with its reward (``done``) or why it failed (``error``: an exception, a non-zero exit, an unreadable
reward; a timeout is the pool's). The agent is

* a callable ``package.module:function(client, row)``: ``client`` is an ``openai.OpenAI`` bound to
  the session (``openai.AsyncOpenAI`` for a coroutine function); it returns the reward, a number
  or a dict with ``score`` (and optionally ``acc``);
* a command, run by the shell with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``PSRL_SESSION_ID``
  set and the row as JSON on stdin; the last line it prints is its reward (a number or JSON with
  ``score``).

A step run again on a fresh worker (its worker died), or by a restarted session scheduler, runs
the agent again from the start: its calls that repeat the session's turns get those turns back
(``psrl.gateway.resume``), so no turn is generated twice. A worker dies with the scheduler that
started it, and a command with its worker (Linux ``PR_SET_PDEATHSIG``): an agent of a dead
scheduler never calls on after its replacement took its session over.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx

from psrl.envs.host import StepReply, StepRequest, serve_steps
from psrl.gateway.agent_task import AgentTask, conversation
from psrl.module_files import ModuleFileError, load_module


class AgentError(RuntimeError):
    """The agent failed; the text says how (it fails only its session)."""


def score_of(value: Any) -> tuple[float, float]:
    """An agent's reward as (score, acc): a number, or a dict with ``score`` (and ``acc``)."""
    if isinstance(value, dict) and "score" in value:
        score, acc = value["score"], value.get("acc", value["score"])
    else:
        score, acc = value, value
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not isinstance(acc, (int, float)):
        raise AgentError(f"the agent's reward is {value!r}, not a number or {{'score': number}}")
    return float(score), float(acc)


def last_line_score(stdout: str) -> tuple[float, float]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise AgentError("the agent command printed no reward")
    try:
        return score_of(json.loads(lines[-1]))
    except ValueError as exc:
        raise AgentError(f"the agent command's last line is not a reward: {lines[-1][:200]!r}") from exc


class AgentRunner:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.task: AgentTask = AgentTask.from_config(_ConfigView(spec))
        self.base_url, self.token = spec["base_url"], spec["token"] or "psrl"

    def run(self, request: StepRequest) -> StepReply:
        try:
            score, acc = self._run(request)
        except Exception as exc:  # an agent is user code: any failure fails only its session
            return StepReply(request.request_id, request.turn, [], error=f"agent failed: {type(exc).__name__}: {exc}")
        return StepReply(request.request_id, request.turn, [], score, acc, done=True)

    def _run(self, request: StepRequest) -> tuple[float, float]:
        prompt = self.task.prompt(request.prompt_id)
        messages, tools = conversation(prompt.row)
        sid = str(request.request_id)
        opened = httpx.post(
            f"{self.base_url}/sessions",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
            json={
                "request_id": request.request_id,
                "messages": messages,
                "tools": tools,
                "prompt_token_ids": list(prompt.token_ids),
            },
        )
        if opened.status_code != 200:
            raise AgentError(f"the gateway did not open session {sid}: {opened.status_code} {opened.text[:300]}")
        session_url = f"{self.base_url}/sessions/{sid}/v1"
        if self.spec["command"]:
            return self._command(session_url, sid, prompt.row)
        return self._callable(session_url, prompt.row)

    def _callable(self, session_url: str, row: dict[str, Any]) -> tuple[float, float]:
        import openai

        agent = load_callable(self.spec["entry"])
        if inspect.iscoroutinefunction(agent):
            return score_of(asyncio.run(_run_async(agent, session_url, self.token, row)))
        client = openai.OpenAI(base_url=session_url, api_key=self.token, max_retries=2)
        try:
            return score_of(agent(client, row))
        finally:
            client.close()

    def _command(self, session_url: str, sid: str, row: dict[str, Any]) -> tuple[float, float]:
        env = {**os.environ, "OPENAI_BASE_URL": session_url, "OPENAI_API_KEY": self.token, "PSRL_SESSION_ID": sid}
        done = subprocess.run(
            self.spec["command"],
            shell=True,
            preexec_fn=die_with_parent,  # only a prctl between fork and exec
            input=json.dumps(row),
            capture_output=True,
            text=True,
            env=env,
            timeout=self.spec["timeout_s"],
            check=False,
        )
        if done.returncode != 0:
            raise AgentError(f"the agent command exited with {done.returncode}: {done.stderr.strip()[-500:]}")
        return last_line_score(done.stdout)


def load_callable(spec: str) -> Any:
    """``package.module:function`` or ``path/to/file.py:function``."""
    target, _, name = spec.rpartition(":")
    try:
        module = load_module(target, "psrl_agent")
    except ModuleFileError as exc:
        raise AgentError(f"the agent: {exc}") from None
    return getattr(module, name)


async def _run_async(agent: Any, session_url: str, token: str, row: dict[str, Any]) -> Any:
    import openai

    async with openai.AsyncOpenAI(base_url=session_url, api_key=token, max_retries=2) as client:
        return await agent(client, row)


class _ConfigView:
    """The config fields ``AgentTask.from_config`` reads, from the worker's spec (plain data over the pipe)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.model = _Obj(path=spec["model_dir"], tokenizer_path=None)
        self.agent = _Obj(dataset=spec["dataset"], gateway=_Obj(chat_template=spec["chat_template"]))


class _Obj:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def serve_agents(connection: Any, spec_json: str) -> None:
    """An env worker process running agents: one step request (a session's agent run) at a time."""
    die_with_parent()
    serve_steps(connection, AgentRunner(json.loads(spec_json)).run, "agent-heartbeat")
