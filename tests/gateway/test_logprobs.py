"""Log-probs in chat answers, in the OpenAI SDK's shape: each generated token's own (the engine's,
as the TITO record keeps them), its likeliest alternatives up to what the engine returns, and a 400
naming the parameter for a call asking more, or for a turn whose log-probs are not known."""

from __future__ import annotations

import openai
import pytest

from psrl.gateway.api import ApiError, parse_chat
from psrl.gateway.chat_templates import bundled
from psrl.gateway.local import EngineGateway
from psrl.gateway.sessions import Answer, Gateway, Settings
from tests.gateway.conftest import TOP_LOGPROBS
from tests.gateway.test_openai_sdk import client, open_session, record

ASK = [{"role": "user", "content": "sum 1 2"}]


def test_logprobs_and_top_logprobs_are_the_engines(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    llm = client(gateway, sid)
    answer = llm.chat.completions.create(model="psrl", messages=ASK, logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    assert content is not None and len(content) == answer.usage.completion_tokens
    [traj] = record(gateway, sid)["trajectories"]
    assert [entry.logprob for entry in content] == pytest.approx(traj["turns"][0]["logprobs"])
    for entry in content:
        alternatives = [alt.logprob for alt in entry.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert entry.logprob <= alternatives[0] + 1e-5  # nothing is likelier than the likeliest
        assert entry.bytes == list(entry.token.encode())


def test_streamed_answers_carry_the_same_logprobs(gateway: EngineGateway) -> None:
    sid = open_session(gateway)
    llm = client(gateway, sid)
    stream = llm.chat.completions.create(model="psrl", messages=ASK, logprobs=True, stream=True)
    streamed = [e.logprob for chunk in stream for c in chunk.choices if c.logprobs for e in c.logprobs.content or []]
    [traj] = record(gateway, sid)["trajectories"]
    assert streamed == pytest.approx(traj["turns"][0]["logprobs"])
    # the same call again is the recorded turn: the same log-probs, nothing generated twice
    again = llm.chat.completions.create(model="psrl", messages=ASK, logprobs=True)
    assert [e.logprob for e in again.choices[0].logprobs.content or []] == pytest.approx(streamed)
    assert len(record(gateway, sid)["trajectories"][0]["turns"]) == 1


def test_more_alternatives_than_the_engine_returns_is_a_400(gateway: EngineGateway) -> None:
    llm = client(gateway, open_session(gateway))
    with pytest.raises(openai.BadRequestError) as caught:
        llm.chat.completions.create(model="psrl", messages=ASK, logprobs=True, top_logprobs=TOP_LOGPROBS + 1)
    assert caught.value.body["param"] == "top_logprobs" and f"at most {TOP_LOGPROBS}" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        llm.chat.completions.create(model="psrl", messages=ASK, top_logprobs=2)  # without logprobs
    assert "needs 'logprobs': true" in caught.value.body["message"]


def test_a_turn_without_known_logprobs_is_a_400_naming_session_and_turn() -> None:
    gateway = Gateway(bundled("demo"), _encode, _decode, _decode, Settings(one_trajectory=True))
    gateway.open("9")
    assert gateway.call("9", parse_chat({"messages": ASK, "logprobs": True})) is not None  # an order
    with pytest.raises(ApiError) as caught:
        gateway.generated("9", _encode("ans 3"), "stop")  # the generator gave no log-probs
    assert caught.value.status == 400 and caught.value.param == "logprobs"
    assert "session 9 turn 0" in caught.value.message
    answer = gateway.call("9", parse_chat({"messages": ASK}))  # asked again without: the recorded turn
    assert isinstance(answer, Answer) and answer.text == "ans 3"
    with pytest.raises(ApiError) as caught:
        gateway.call("9", parse_chat({"messages": ASK, "logprobs": True, "top_logprobs": 1}))
    assert caught.value.status == 400 and caught.value.param == "top_logprobs"


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def _decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)
