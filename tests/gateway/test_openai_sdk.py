"""The official openai client (sync, async, streaming, tools) against a real gateway: uvicorn on a
loopback socket, the embedded engine with the demo model and its chat template behind it."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

from psrl.gateway.local import EngineGateway
from tests.gateway.conftest import TOKEN

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]


def open_session(gateway: EngineGateway) -> str:
    answer = httpx.post(f"{gateway.url}/sessions", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200
    return str(answer.json()["id"])


def record(gateway: EngineGateway, sid: str) -> dict:
    return httpx.get(f"{gateway.url}/sessions/{sid}", headers={"Authorization": f"Bearer {TOKEN}"}).json()


def client(gateway: EngineGateway, sid: str, key: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key=key, max_retries=0)


def test_sync_turns_extend_one_trajectory_with_usage(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    llm = client(gateway, sid)
    messages: list = [{"role": "system", "content": "you add"}, {"role": "user", "content": "sum 1 2 3"}]
    for turn in range(3):
        answer = llm.chat.completions.create(model="psrl", messages=messages, max_tokens=8)
        choice = answer.choices[0]
        assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
        assert answer.usage is not None and answer.usage.completion_tokens <= 8 and answer.usage.prompt_tokens > 0
        messages += [
            {"role": "assistant", "content": choice.message.content},
            {"role": "user", "content": f"more {turn}"},
        ]
    [traj] = record(gateway, sid)["trajectories"]
    assert len(traj["turns"]) == 3 and traj["branch_of"] == -1
    ends = [t["prompt_tokens"] + t["completion_tokens"] for t in traj["turns"]]
    assert all(a < b["prompt_tokens"] for a, b in zip(ends, traj["turns"][1:], strict=False))  # each prompt extends
    assert sum(traj["loss_mask"]) == sum(t["completion_tokens"] for t in traj["turns"])
    assert all(len(t["logprobs"]) == t["completion_tokens"] for t in traj["turns"])  # the engine's, per token
    answer = llm.chat.completions.create(model="psrl", messages=[{"role": "user", "content": "x"}], logprobs=True)
    assert answer.choices[0].logprobs is not None
    assert len(answer.choices[0].logprobs.content or []) == answer.usage.completion_tokens
    assert all(entry.logprob <= 0 for entry in answer.choices[0].logprobs.content or [])


def test_async_sessions_run_concurrently(gateway: EngineGateway) -> None:
    async def one(index: int) -> int:
        sid = open_session(gateway)
        llm = openai.AsyncOpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key=TOKEN, max_retries=0)
        messages: list = [{"role": "user", "content": f"sum {index} 1"}]
        for _ in range(2):
            answer = await llm.chat.completions.create(model="psrl", messages=messages, max_completion_tokens=6)
            messages += [answer.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
        await llm.close()
        return len(record(gateway, sid)["trajectories"][0]["turns"])

    async def all_of_them() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(6)))

    assert asyncio.run(all_of_them()) == [2] * 6


def test_streaming_gives_the_same_turn_as_the_record(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    stream = client(gateway, sid).chat.completions.create(
        model="psrl",
        messages=[{"role": "user", "content": "sum 4 5"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert (
        finish
        and usage
        and usage[0].completion_tokens == record(gateway, sid)["trajectories"][0]["turns"][0]["completion_tokens"]
    )
    again = client(gateway, sid).chat.completions.create(
        model="psrl", messages=[{"role": "user", "content": "sum 4 5"}]
    )
    assert again.choices[0].message.content == text  # the same call again: the recorded turn, not a new one


def test_tools_and_tool_results_render_through_the_template(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    llm = client(gateway, sid)
    messages: list = [
        {"role": "user", "content": "add 1 2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    answer = llm.chat.completions.create(model="psrl", messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=6)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    [traj] = record(gateway, sid)["trajectories"]
    prompt = traj["token_ids"][: traj["turns"][0]["prompt_tokens"]]
    assert gateway.codec.decode(prompt) == "user=add 1 2 assistant=call add a=1<eos> tool=3 assistant="


def test_bad_input_gets_openai_errors(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    with pytest.raises(openai.NotFoundError):
        client(gateway, "nope").chat.completions.create(model="psrl", messages=[{"role": "user", "content": "a"}])
    with pytest.raises(openai.AuthenticationError):
        client(gateway, sid, key="wrong").chat.completions.create(
            model="psrl", messages=[{"role": "user", "content": "a"}]
        )
    with pytest.raises(openai.BadRequestError):
        client(gateway, sid).chat.completions.create(model="psrl", messages=[{"role": "robot", "content": "a"}])
    with pytest.raises(openai.BadRequestError):
        client(gateway, sid).chat.completions.create(model="psrl", messages=[{"role": "user", "content": "a"}], n=2)
    with pytest.raises(openai.NotFoundError):
        client(gateway, sid).chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "a"}])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{gateway.url}/sessions/{sid}/v1/chat/completions"
    malformed = httpx.post(url, content=b"{not json", headers=auth)
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(url, content=b"x" * (2 << 20), headers=auth).status_code == 413
    too_long = [{"role": "user", "content": "1 " * 400}]
    with pytest.raises(openai.APIStatusError) as caught:
        client(gateway, sid).chat.completions.create(model="psrl", messages=too_long)
    assert caught.value.status_code == 413


def test_a_second_call_in_flight_gets_429_and_a_deleted_session_404(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    llm = client(gateway, sid)
    first = threading.Thread(
        target=lambda: llm.chat.completions.create(
            model="psrl", messages=[{"role": "user", "content": "sum 1 1"}], max_tokens=12
        )
    )
    first.start()
    deadline = time.monotonic() + 30
    while not record(gateway, sid)["in_flight"] and first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    if record(gateway, sid)["in_flight"]:
        with pytest.raises(openai.RateLimitError):
            llm.chat.completions.create(model="psrl", messages=[{"role": "user", "content": "sum 2 2"}])
    first.join()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.delete(f"{gateway.url}/sessions/{sid}", headers=auth).json()["deleted"] is True
    assert httpx.get(f"{gateway.url}/sessions/{sid}", headers=auth).status_code == 404


def test_an_edited_history_branches(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    llm = client(gateway, sid)
    messages: list = [{"role": "user", "content": "sum 1 2"}]
    reply = llm.chat.completions.create(model="psrl", messages=messages, max_tokens=4).choices[0].message.content
    llm.chat.completions.create(
        model="psrl",
        max_tokens=4,
        messages=[*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "again"}],
    )
    llm.chat.completions.create(
        model="psrl", max_tokens=4, messages=[{"role": "system", "content": "be short"}, *messages]
    )
    trajectories = record(gateway, sid)["trajectories"]
    assert (
        len(trajectories) == 2
        and len(trajectories[0]["turns"]) == 2
        and trajectories[1]["turns"][0]["prompt_tokens"] > 0
    )


def test_text_completions_continue_the_session(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    llm = client(gateway, sid)
    first = llm.completions.create(model="psrl", prompt="sum 1 2 =", max_tokens=4)
    assert first.usage is not None and first.usage.prompt_tokens == 9
    llm.completions.create(model="psrl", prompt="sum 1 2 =" + first.choices[0].text + " more", max_tokens=4)
    [traj] = record(gateway, sid)["trajectories"]
    assert len(traj["turns"]) == 2
