"""TITO per template family: over 24 turns with tool calls, every prompt the engine sees extends the
session's exact tokens, and when the model writes what the template would, the prompt is the
template's own rendering of the whole conversation, byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer

from psrl.gateway.chat_templates import ChatTemplate, bundled, load_template
from psrl.gateway.messages import normalize
from psrl.gateway.replies import make_reply
from psrl.gateway.tito import TitoError, TitoSession
from tests.gateway.family_tokenizers import codec, family_tokenizer, stop_id

DEMO_DIR = "psrl/assets/demo_model"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "demo": "call getweather city=paris",
}
COMPACT = {  # what a model may write instead: the template would space it otherwise
    "hermes": '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
    "llama3": '{"name":"get_weather","parameters":{"city":"Paris"}}',
    "demo": "call getweather city=paris",
}


class Family:
    def __init__(self, name: str) -> None:
        self.name = name
        if name == "demo":
            tokenizer = Tokenizer.from_file(f"{DEMO_DIR}/tokenizer.json")
            self.template: ChatTemplate = load_template(DEMO_DIR)
            self.encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids
            self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
            self.stop = 1
        else:
            tokenizer = family_tokenizer(name)
            self.template = bundled(name, "<|begin_of_text|>" if name == "llama3" else "")
            self.encode, self.decode = codec(name)
            self.stop = stop_id(name)
        self.text = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        self.tools = TOOLS if name != "demo" else [{"type": "function", "function": {"name": "getweather"}}]

    def user(self, i: int) -> str:
        return f"question {i} what is it" if self.name == "demo" else f"Question {i}: what is the weather?"

    def model(self, turn: int, compact: bool) -> tuple[list[int], str]:
        """The engine's tokens for a turn: a tool call every other turn, a cut-off answer now and then."""
        if turn % 2 == 0:
            return [*self.encode((COMPACT if compact else CALLS)[self.name]), self.stop], "stop"
        answer = f"the answer is {turn}" if self.name == "demo" else f"The answer is {turn}."
        if turn % 7 == 3:
            return self.encode(answer)[:5], "length"
        return [*self.encode(answer), self.stop], "stop"


def converse(family: Family, turns: int, compact: bool = False) -> tuple[TitoSession, list[dict[str, Any]], list[Any]]:
    session = TitoSession("s1", family.template, family.encode, family.decode)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "you help" if family.name == "demo" else "You help."},
        {"role": "user", "content": family.user(0)},
    ]
    plans = []
    parser = family.name
    for turn in range(turns):
        plan = session.plan(normalize(messages), family.tools)
        assert plan.kind == ("branch" if turn == 0 else "continue")
        generated, finish = family.model(turn, compact)
        reply = make_reply(family.text(generated), finish, parser, [], f"call-{turn}")
        session.record(plan, generated, reply.canonical, reply.finish_reason)
        plans.append((plan, generated))
        messages.append(reply.message)
        if reply.message.get("tool_calls"):
            assert not reply.malformed_tool_call
            for call in reply.message["tool_calls"]:
                content = "sunny" if family.name == "demo" else '{"temperature": 21}'
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        else:
            messages.append({"role": "user", "content": family.user(turn + 1)})
    return session, messages, plans


@pytest.mark.parametrize("name", ["hermes", "llama3", "demo"])
def test_tokens_are_the_engines_and_the_template_s_byte_for_byte(name: str) -> None:
    family = Family(name)
    session, messages, plans = converse(family, 24)
    [traj] = session.trajectories
    assert len(traj.turns) == 24
    for plan, generated in plans:  # each prompt extends the exact tokens, its generation follows it
        prompt = plan.prompt
        assert traj.tokens[: len(prompt)] == prompt
        assert traj.tokens[len(prompt) : len(prompt) + len(generated)] == generated
    assert sum(traj.loss_mask) == sum(len(g) for _, g in plans)
    # the next prompt, decoded, is the template's rendering of the whole conversation
    nxt = session.plan(normalize(messages), family.tools)
    assert family.decode(nxt.prompt) == family.template.render(normalize(messages), family.tools, True)
    assert nxt.prompt[: len(traj.tokens)] == traj.tokens


@pytest.mark.parametrize("name", ["hermes", "llama3"])
def test_a_tool_call_written_otherwise_keeps_the_model_s_own_tokens(name: str) -> None:
    family = Family(name)
    session, messages, plans = converse(family, 21, compact=True)
    [traj] = session.trajectories
    for plan, generated in plans:
        assert traj.tokens[len(plan.prompt) : len(plan.prompt) + len(generated)] == generated
    rendered = family.template.render(normalize(messages), family.tools, True)
    nxt = session.plan(normalize(messages), family.tools)
    assert family.decode(nxt.prompt) != rendered  # the model's compact JSON stays as it wrote it
    assert COMPACT[name] in family.decode(nxt.prompt)


def test_an_edited_history_branches_from_the_longest_common_prefix() -> None:
    family = Family("hermes")
    session, messages, _ = converse(family, 6)
    edited = [*messages[:5], {"role": "user", "content": "Something else entirely."}]  # after turn 1's reply
    plan = session.plan(normalize(edited), family.tools)
    assert plan.kind == "branch" and plan.branch_of == 0 and plan.turn == 2
    main = session.trajectories[0]
    assert plan.base == main.tokens[: main.turns[1].prompt_len + len(main.turns[1].generated)]
    session.record(plan, [*family.encode("Fine."), family.stop], {"role": "assistant", "content": "Fine."}, "stop")
    assert len(session.trajectories) == 2 and len(session.trajectories[0].turns) == 6
    branch = session.trajectories[1]
    assert branch.branch_at == len(plan.base) and len(branch.turns) == 3
    # a new system prompt shares no message: a fresh rendering, its common token prefix recorded
    fresh = session.plan(normalize([{"role": "system", "content": "Be brief."}, *messages[1:2]]), family.tools)
    assert fresh.kind == "branch" and fresh.turn == 0 and 0 < len(fresh.base) < len(fresh.prompt)


def test_the_same_call_again_gets_the_recorded_turn() -> None:
    family = Family("hermes")
    session, messages, _ = converse(family, 4)
    plan = session.plan(normalize(messages[:2]), family.tools)
    assert plan.kind == "recorded" and plan.turn == 0 and len(session.trajectories) == 1


def test_a_template_that_re_renders_history_beyond_the_trim_bound_names_session_and_turn() -> None:
    family = Family("hermes")
    # a template that drops earlier assistant turns' content once a later message follows
    source = family.template.source.replace(
        "message.content + '<|im_end|>'", "(message.content if loop.last else '') + '<|im_end|>'"
    )
    session = TitoSession("s9", ChatTemplate(source, "hermes"), family.encode, family.decode, max_trim_tokens=1)
    messages = normalize([{"role": "user", "content": "Hi there."}])
    plan = session.plan(messages, [])
    session.record(
        plan,
        [*family.encode("The answer is 42."), family.stop],
        {"role": "assistant", "content": "The answer is 42."},
        "stop",
    )
    nxt = normalize(
        [
            {"role": "user", "content": "Hi there."},
            {"role": "assistant", "content": "The answer is 42."},
            {"role": "user", "content": "And?"},
        ]
    )
    with pytest.raises(TitoError, match=r"session s9 turn 1.*max_trim_tokens=1"):
        session.plan(nxt, [])


def test_smollm2_s_own_template_and_tokenizer_byte_for_byte() -> None:
    """SmolLM2-135M-Instruct (``make model-smollm2``): its own ChatML template and 49k-token tokenizer."""
    import os
    from pathlib import Path

    from psrl.gateway.codec import load_codec

    model = (
        Path(os.environ.get("PSRL_MODELS_DIR", Path.home() / ".cache" / "psrl" / "models")) / "SmolLM2-135M-Instruct"
    )
    if not (model / "tokenizer.json").is_file():
        pytest.skip(f"no SmolLM2 at {model} (make model-smollm2)")
    template, codec = load_template(str(model)), load_codec(str(model))
    session = TitoSession("s", template, codec.encode, codec.decode)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Hi!"}]
    for turn in range(22):
        plan = session.plan(normalize(messages), [])
        generated = [*codec.encode(f"The answer is {turn}."), *codec.encode("<|im_end|>")]
        reply = make_reply(codec.text(generated), "stop", "none", [], f"c{turn}")
        session.record(plan, generated, reply.canonical, "stop")
        messages += [reply.message, {"role": "user", "content": f"And {turn}?"}]
    nxt = session.plan(normalize(messages), [])
    assert codec.decode(nxt.prompt) == template.render(normalize(messages), [], True)
    assert nxt.prompt[: len(session.trajectories[0].tokens)] == session.trajectories[0].tokens
