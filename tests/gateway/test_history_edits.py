"""History edits as a training run's gateway takes them, through the official openai client: a
run's session is one trajectory, so a conversation that edits the session's history is refused
with 409 naming the session, the turn and the tokens it keeps; the same call repeated, and the
session's real continuation, still work afterwards (the refusal changed nothing)."""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest

from psrl.gateway.local import EngineGateway
from tests.gateway.conftest import TOKEN


@pytest.fixture
def run_gateway(gateway: EngineGateway, monkeypatch: pytest.MonkeyPatch) -> EngineGateway:
    """The shared in-process gateway, its sessions unable to branch while the test runs (as a run's)."""
    monkeypatch.setattr(gateway.gateway, "settings", dataclasses.replace(gateway.gateway.settings, can_branch=False))
    return gateway


def test_an_edited_history_in_a_run_is_refused_naming_session_turn_and_kept_tokens(
    run_gateway: EngineGateway,
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    sid = httpx.post(f"{run_gateway.url}/sessions", json={}, headers=auth).json()["id"]
    with openai.OpenAI(base_url=f"{run_gateway.url}/sessions/{sid}/v1", api_key=TOKEN, max_retries=0) as llm:
        _edit_and_check(run_gateway, sid, llm)


def _edit_and_check(run_gateway: EngineGateway, sid: str, llm: openai.OpenAI) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    messages: list = [{"role": "user", "content": "sum 1 2"}]
    reply = llm.chat.completions.create(model="psrl", messages=messages).choices[0].message.content
    history = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
    llm.chat.completions.create(model="psrl", messages=history)
    tokens = len(httpx.get(f"{run_gateway.url}/sessions/{sid}", headers=auth).json()["trajectories"][0]["token_ids"])

    # the agent drops its last reply and asks otherwise (mini-swe-agent's format errors do this): that
    # would be turn 1 of a branch keeping the first turn's tokens
    edited = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "answer as ans"}]
    with pytest.raises(openai.ConflictError) as refused:
        llm.chat.completions.create(model="psrl", messages=edited)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "history_edited"
    assert f"session {sid} turn 1:" in error["message"] and f"of the session's {tokens} tokens" in error["message"]
    with pytest.raises(openai.ConflictError):  # a changed system prompt too
        llm.chat.completions.create(model="psrl", messages=[{"role": "system", "content": "be short"}, *messages])

    again = llm.chat.completions.create(model="psrl", messages=history)  # recorded: the same answer
    assert again.choices[0].message.content is not None
    record = httpx.get(f"{run_gateway.url}/sessions/{sid}", headers=auth).json()
    assert len(record["trajectories"]) == 1 and len(record["trajectories"][0]["token_ids"]) == tokens
